"""The contract between the operator and the training runtime: `pstrainer.contract`, re-exported.

The runtime library (images/trainer, the `pstrainer` distribution) owns the contract because it
installs into users' TensorFlow images and so may depend on nothing; the operator depends on it.
"""

from pstrainer.contract import *  # noqa: F403
from pstrainer.contract import __all__ as __all__

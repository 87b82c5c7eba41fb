"""pstrainer: the contract of ps-training-operator for TensorFlow programs, and the bundled runtime.

A program gets the contract with `pstrainer.main(train)` (every role; the exit codes) and, on the
chief, `pstrainer.keras.ContractCallback` in `model.fit` or a `pstrainer.TrainingLoop` around a
custom loop. Importing this package does not import TensorFlow.
"""

from typing import Any

from pstrainer.contract import ExitCode
from pstrainer.runtime import main, session
from pstrainer.task import ConfigError, Task, load_task

__version__ = "0.1.0"
__all__ = ["ConfigError", "ExitCode", "Task", "TrainingLoop", "load_task", "main", "session"]


def __getattr__(name: str) -> Any:
    if name == "TrainingLoop":  # imports TensorFlow
        from pstrainer.loop import TrainingLoop

        return TrainingLoop
    raise AttributeError(f"module 'pstrainer' has no attribute {name!r}")

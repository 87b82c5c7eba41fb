"""Restore a job's latest checkpoint as its chief does, and write down what every variable then holds.

Started in the chief's pod in place of the trainer (LocalCluster.start with this as entrypoint),
so with the chief's environment, arguments and network namespace:

    python restore_probe.py OUT.npz [chief args...]

It connects to the job's parameter servers and workers (pstrainer.chief.connect), restores
through the library's Checkpointer, as the chief's training loop does, then reads every variable
back from the parameter servers.
OUT.npz holds, per checkpoint key, `value:<key>` (the shards joined) and `devices:<key>` (where
each shard lives), plus `pstrainer:file`, so a test can tell which trainer ran.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

import pstrainer
from pstrainer.checkpoints import STEP_KEY, VALUE_SUFFIX, Checkpointer
from pstrainer.chief import checkpointed, connect
from pstrainer.config import load_config
from pstrainer.model import shards
from pstrainer.progress import ProgressTracker


def restored_variables(argv: list[str]) -> dict[str, Any]:
    """What the chief's objects hold after its restore, keyed as in the checkpoint."""
    config = load_config(argv, os.environ)
    cluster = connect(config)
    objects = {"model": cluster.model, "optimizer": cluster.optimizer}
    checkpointer = Checkpointer(config.task, objects, ProgressTracker())
    checkpointer.restore()
    variables = checkpointed(cluster.model, cluster.optimizer)
    out: dict[str, Any] = {f"value:{STEP_KEY}": np.array(checkpointer.step, np.int64)}
    for path, variable in variables.items():
        parts = shards(variable)
        out[f"value:{path}{VALUE_SUFFIX}"] = np.concatenate([part.numpy() for part in parts])
        out[f"devices:{path}{VALUE_SUFFIX}"] = np.array([part.device for part in parts])
    return out


def main() -> None:
    output, argv = sys.argv[1], sys.argv[2:]
    arrays = restored_variables(argv)
    arrays["pstrainer:file"] = np.array(pstrainer.__file__)
    np.savez(output, **arrays)
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's teardown of the coordinator can hang


if __name__ == "__main__":
    main()

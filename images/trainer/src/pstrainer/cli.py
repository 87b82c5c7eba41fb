"""`pstrainer`: the bundled runtime, one entrypoint for every role of a PSTrainingJob.

A user of the library (pstrainer.runtime) like any other: the role comes from TF_CONFIG (and must
agree with PSOP_ROLE); ps and worker serve, the chief trains the example model and checkpoints,
the evaluator follows checkpoints. Exit codes are the contract's ExitCode; see
docs/reference/runtime.md.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pstrainer.config import ConfigError, load_config
from pstrainer.runtime import refuse_configuration, run, start


class _QuietJoins(logging.Filter):
    """Drop the coordinator's line for every join (one per dispatch); keep the rest of TF's logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Waiting for all global closures")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )
    if level != "DEBUG":
        logging.getLogger("tensorflow").addFilter(_QuietJoins())


def main(argv: Sequence[str] | None = None) -> NoReturn:
    exiter = start()
    env = dict(os.environ)
    _setup_logging(env.get("PSTRAINER_LOG_LEVEL", "INFO").upper())
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, env)
    except ConfigError as err:
        refuse_configuration(exiter, env, err)
    _setup_logging(config.log_level)

    def chief() -> str:
        from pstrainer.chief import run_chief

        return run_chief(config)

    def evaluator() -> str:
        from pstrainer.evaluator import run_evaluator

        return run_evaluator(config)

    run(config.task, exiter, chief=chief, evaluator=evaluator, total_steps=config.steps)

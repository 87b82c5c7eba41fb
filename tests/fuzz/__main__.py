"""Run one harness under atheris (libFuzzer): `python -m tests.fuzz NAME [--seconds N | --runs N]`.

The code under test (psoperator, pstrainer) is instrumented as the harness imports it, so the
fuzzer is guided by the coverage of the operator's code. The harness's seed inputs in the
repository (tests/fuzz/corpus/NAME) are run first; what the fuzzer finds new goes to --corpus
(outside the repository), a failing input to --artifacts; `python -m tests.fuzz NAME FILE...` runs
inputs once each. Anything after `--` goes to libFuzzer as it is (e.g. `-- -max_len=8192`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import atheris

from tests.fuzz import HARNESSES

SEEDS = Path(__file__).parent / "corpus"


def main(argv: list[str]) -> None:
    ours, _, theirs = (
        (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :]) if "--" in argv else (argv, "", [])
    )
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("harness", choices=HARNESSES)
    parser.add_argument("inputs", nargs="*", type=Path, help="run these inputs once each, instead of fuzzing")
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument("--seconds", type=int, help="fuzz this long")
    limit.add_argument("--runs", type=int, help="fuzz this many inputs (deterministic with --seed)")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer's random seed (0: from the clock)")
    parser.add_argument(
        "--corpus", type=Path, help="where the inputs found go (default: a new directory under the temp dir)"
    )
    parser.add_argument("--artifacts", type=Path, default=Path("."), help="where a failing input goes")
    args = parser.parse_args(ours)

    args.artifacts.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-seed={args.seed}",
        f"-artifact_prefix={args.artifacts}/{args.harness}-",
        "-print_final_stats=1",
    ]
    if args.seconds is not None:
        flags.append(f"-max_total_time={args.seconds}")
    if args.runs is not None:
        flags.append(f"-runs={args.runs}")
    dirs = [str(path) for path in args.inputs] or _corpus(args.harness, args.corpus)
    with atheris.instrument_imports(include=["psoperator", "pstrainer"]):
        harness = importlib.import_module(f"tests.fuzz.{args.harness}")
    atheris.Setup([sys.argv[0], *flags, *theirs, *dirs], harness.TestOneInput)
    atheris.Fuzz()


def _corpus(harness: str, found: Path | None) -> list[str]:
    """Where the fuzzer writes what it finds (the first directory: never the seeds of the
    repository), then the harness's seeds."""
    found = (found or Path(tempfile.mkdtemp(prefix="psoperator-fuzz-"))) / harness
    found.mkdir(parents=True, exist_ok=True)
    seeds = SEEDS / harness
    return [str(found)] + ([str(seeds)] if seeds.is_dir() else [])


if __name__ == "__main__":
    main(sys.argv[1:])

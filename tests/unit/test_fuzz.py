"""Each fuzzing harness (tests/fuzz) runs for a fixed number of inputs from a fixed random seed: an
uncaught exception, or a promise a harness asserts that does not hold, fails the test with the input
that broke it (written to the test's tmp_path) and libFuzzer's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import HARNESSES

ROOT = Path(__file__).parents[2]
# Inputs per harness: a few seconds each on a loaded machine (the spec's renders are the slowest).
RUNS = {
    "progress_report": 4000,
    "checkpoint_answer": 4000,
    "checkpoint_request": 4000,
    "pods": 1500,
    "children": 500,
    "tracking": 2000,
    "render": 150,
}


def test_every_harness_has_a_bound() -> None:
    assert sorted(RUNS) == sorted(HARNESSES)


@pytest.mark.parametrize("harness", HARNESSES)
def test_the_fuzzer_finds_nothing(harness: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.fuzz", harness, "--runs", str(RUNS[harness]), "--seed", "1"]
    command += ["--corpus", str(tmp_path / "corpus"), "--artifacts", str(tmp_path / "artifacts")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    report = result.stderr[-6000:]
    assert result.returncode == 0, report
    assert f"Done {RUNS[harness]} runs" in result.stderr, report

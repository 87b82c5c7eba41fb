"""The commands the real-kubelet fixtures run (the node's script, the image build, helm), each with
its output kept for the failure message or in a log file under the cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.paths import CACHE, REPO

REALNODE_SH = REPO / "e2e" / "cluster" / "realnode.sh"
BUILD_IMAGES = REPO / "images" / "build.sh"
LOGS = CACHE / "real" / "logs"


def run(*args: str | Path, timeout: float = 600, log: str | None = None) -> str:
    """Runs a command; its stderr (or the log file named `log`) is in the error when it fails."""
    command = [str(a) for a in args]
    if log is None:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-6000:]}")
        return result.stdout
    LOGS.mkdir(parents=True, exist_ok=True)
    path = LOGS / log
    with path.open("w") as out:
        code = subprocess.run(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        ).returncode
    if code != 0:
        pytest.fail(f"{' '.join(command)} failed ({code}):\n{path.read_text(errors='replace')[-6000:]}")
    return path.read_text(errors="replace")


def helm(kubeconfig: Path, *args: str, timeout: float = 300) -> str:
    return run(CACHE / "bin" / "helm", "--kubeconfig", str(kubeconfig), *args, timeout=timeout)

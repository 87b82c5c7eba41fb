"""kubectl as the e2e tests run it: the binary built by e2e/cluster/cluster.sh (else the one on PATH),
against a given kubeconfig."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from e2e.paths import CACHE


def _kubectl() -> str:
    ours = CACHE / "bin" / "kubectl"
    if ours.exists():
        return str(ours)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: build it with e2e/cluster/cluster.sh build", pytrace=False)
    return found


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    result = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout

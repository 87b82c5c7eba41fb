"""Fixtures of the trainer tests: a private network and a job's parameter servers and workers.

The TensorFlow tests share one set of ps and worker processes for the whole module (they are
only servers; every test runs its own chief against them, with its own checkpoint directory), so
TensorFlow is imported by five processes once instead of once per test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator

import pytest
from tfcluster.jobs import ctr_job
from tfcluster.launcher import LocalCluster
from tfcluster.netns import PrivateNetwork, available, remove_stale

NETNS_PREFIX = "pst"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("tensorflow") is None:
        return "tensorflow is not installed"
    if importlib.util.find_spec("pstrainer") is None:
        return "pstrainer is not installed (pip install -e images/trainer)"
    reason: str | None = available()
    return reason


def _require_namespaces() -> None:
    """Skip (fail in CI) unless TensorFlow processes can run in private networks; clear stale ones."""
    reason = _skip_reason()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the TensorFlow tests must run in CI: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)
    remove_stale(NETNS_PREFIX)


@pytest.fixture(scope="module")
def network() -> Iterator[PrivateNetwork]:
    _require_namespaces()
    with PrivateNetwork(f"{NETNS_PREFIX}{os.getpid()}") as net:
        yield net


@pytest.fixture(scope="module")
def networks() -> Iterator[Callable[[str], PrivateNetwork]]:
    """Makes one private network per name, for a module whose clusters differ in their tasks;
    all are removed when the module ends."""
    _require_namespaces()
    with contextlib.ExitStack() as stack:

        def make(name: str) -> PrivateNetwork:
            return stack.enter_context(PrivateNetwork(f"{NETNS_PREFIX}{os.getpid()}-{name}"))

        yield make


@pytest.fixture(scope="module")
def cluster(network: PrivateNetwork, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """ps-0, ps-1, worker-0, worker-1 running; chief-0 and evaluator-0 ready to start."""
    workdir = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(ctr_job(workdir / "unused", ["--steps=1"]), workdir, network)
    for key in ("ps-0", "ps-1", "worker-0", "worker-1"):
        local.start(key)
    try:
        yield local
    finally:
        local.stop_all()

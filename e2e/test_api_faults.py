"""The operator talks to the API server through e2e/faultproxy.py, which answers a share of its
requests with 429, 5xx, 409 or silence and cuts every watch (half of them with 410 Gone): the jobs of
the chaos run's scenarios still end as they should, and the log does not turn into a storm.
"""

from __future__ import annotations

import collections
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from e2e import chaos_run
from e2e.faultproxy import FaultProxy
from e2e.operator_process import OperatorProcess
from e2e.util import free_port

pytestmark = pytest.mark.usefixtures("kwok_only")

FRACTION = 0.15  # of the operator's requests that fail
# An injected timeout holds the request longer than any step may take: only the operator's own
# request timeout (--api-timeout-seconds) gets its reconcile going again.
STALL = 600.0
API_TIMEOUT = 5.0
# One line repeated more than this is a storm: every injected fault logged again and again.
STORM = 50
TIMESTAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T][\d:.,]+\]?\s*")


def repeated_lines(log: str) -> list[tuple[int, str]]:
    """The log's lines (without their timestamps) by how often they occur, most frequent first."""
    lines = (TIMESTAMP.sub("", line).strip() for line in log.splitlines())
    counts = collections.Counter(line for line in lines if line and not line.startswith("==="))
    return [(n, line) for line, n in counts.most_common()]


def test_jobs_finish_through_api_errors_without_a_log_storm(
    k8s: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    proxy = FaultProxy(kubeconfig, FRACTION, stall=STALL)
    proxy.start()
    operator = OperatorProcess(
        proxy.kubeconfig(operator_kubeconfig, tmp_path / "proxied"),
        namespace,
        tmp_path / "operator.log",
        ["--progress-port", str(free_port()), "--api-timeout-seconds", str(API_TIMEOUT)],
    )
    sampler = chaos_run.Sampler(k8s, namespace, lambda: {"operator": operator.pid})
    sampling = threading.Thread(target=sampler.run, daemon=True)
    try:
        operator.start()
        sampling.start()
        plan = chaos_run.scenarios(len(chaos_run.MIX))
        with ThreadPoolExecutor(len(plan)) as pool:
            outcomes = list(pool.map(lambda job: chaos_run.drive(k8s, namespace, *job), plan))
        sampler.stop()
        sampling.join(timeout=30)
        log = operator.log_text()
    finally:
        operator.stop()
        proxy.stop()
    storms = repeated_lines(log)[:5]
    rss = sampler.rss["operator"]
    third = max(len(rss) // 3, 1)
    print(
        "\n"
        + chaos_run.table(
            [
                ("jobs", len(outcomes)),
                *[(f"injected: {k}", v) for k, v in sorted(proxy.injected.items())],
                ("slowest job", f"{max(o.seconds for o in outcomes):.0f}s"),
                ("operator RSS first/last third", f"{_mean(rss[:third]):.0f}/{_mean(rss[-third:]):.0f} MiB"),
                *[(f"log x{n}", line[:150]) for n, line in storms],
            ]
        )
    )
    assert [f"{o.name} ({o.kind}): {o.error}" for o in outcomes if o.error] == [], log[-20000:]
    assert chaos_run.wrong_endings(k8s, namespace, outcomes) == []
    assert {"429", "500", "503", "409", "timeout", "watch 410", "watch cut"} <= set(proxy.injected)
    assert storms[0][0] <= STORM, storms
    assert sampler.two_chiefs == []
    # One operator for the whole test: its memory ends where it settled after start-up.
    assert _mean(rss[-third:]) <= 1.25 * _mean(rss[third : 2 * third]), rss


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)

"""What the benchmark reads: the API server's request counts for an operator's account, the
operator process's RSS and CPU (from /proc), its reconcile count (its Prometheus metrics), and the
simulated nodes it adds so that thousands of pods fit."""

from __future__ import annotations

import os
import statistics
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from e2e.kubectl import kubectl
from e2e.util import rss_mib, wait_for

WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
Obj = dict[str, Any]
NODE_PODS = 1000  # pods per simulated node the benchmark adds


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cut = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"p50": cut[49], "p95": cut[94], "p99": cut[98], "last": ordered[-1], "n": len(ordered)}


@dataclass(frozen=True)
class Account:
    """A ServiceAccount whose requests the API server counts in two FlowSchemas of its own."""

    namespace: str
    name: str
    flows: str  # the FlowSchemas' names: `<flows>-writes`, `<flows>-others`
    precedence: int  # of the writes' FlowSchema; the others' is the next


def _flow_schema(name: str, precedence: int, account: Account, rules: Obj) -> Obj:
    account_ref = {"name": account.name, "namespace": account.namespace}
    subject = {"kind": "ServiceAccount", "serviceAccount": account_ref}
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-low"},
            "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [subject], **rules}],
        },
    }


def count_requests(api: client.ApiClient, account: Account) -> None:
    """Two FlowSchemas for the account: its writes, and all else (reads, watches, discovery). The
    API server then counts each apart, whatever client library sent them."""
    every: Obj = {"apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
    writes = {"resourceRules": [{**every, "verbs": WRITE_VERBS}]}
    others = {
        "resourceRules": [{**every, "verbs": ["*"]}],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
    }
    custom = client.CustomObjectsApi(api)
    for body in (
        _flow_schema(f"{account.flows}-writes", account.precedence, account, writes),
        _flow_schema(f"{account.flows}-others", account.precedence + 1, account, others),
    ):
        try:
            custom.create_cluster_custom_object("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", body)
        except ApiException as error:
            if error.status != 409:
                raise


@dataclass(frozen=True)
class Requests:
    writes: float
    others: float

    def __sub__(self, before: Requests) -> Requests:
        return Requests(self.writes - before.writes, self.others - before.others)

    @property
    def total(self) -> float:
        return self.writes + self.others


def requests(kubeconfig: Path, account: Account) -> Requests:
    counts = {f"{account.flows}-writes": 0.0, f"{account.flows}-others": 0.0}
    for line in kubectl(kubeconfig, "get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            for name in counts:
                if f'flow_schema="{name}"' in line:
                    counts[name] += float(line.rsplit(" ", 1)[1])
    writes, others = counts.values()
    return Requests(writes, others)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """The CPU time of process `pid`, or of its thread `thread` alone (the main thread's id is `pid`)."""
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Load:
    """The operator's counters at one moment: the CPU time of the process and of its main thread
    (kopf's event loop, where every reconcile decides; the API requests wait in other threads), and
    (count, seconds) of its API requests by verb and of its reconciles, from its metrics."""

    at: float
    cpu: float
    loop_cpu: float
    requests: dict[str, tuple[float, float]]
    reconciles: tuple[float, float]


def load(pid: int, metrics_port: int) -> Load:
    requests = _histogram(metrics_port, "psoperator_api_request_duration_seconds", "verb")
    reconciles = _histogram(metrics_port, "psoperator_reconcile_duration_seconds", None).get("", (0.0, 0.0))
    return Load(time.monotonic(), cpu_seconds(pid), cpu_seconds(pid, pid), requests, reconciles)


def _histogram(metrics_port: int, name: str, by: str | None) -> dict[str, tuple[float, float]]:
    """(count, sum) of the histogram `name`, its series added up by the label `by` (None: all, as "")."""
    counts: dict[str, float] = defaultdict(float)
    sums: dict[str, float] = defaultdict(float)
    for totals, suffix in ((counts, "_count"), (sums, "_sum")):
        for s in _samples(metrics_port, name + suffix):
            totals[s.labels[by] if by else ""] += s.value
    return {key: (count, sums[key]) for key, count in counts.items()}


def load_between(before: Load, after: Load) -> dict[str, Any]:
    """What the operator did from `before` to `after`: its CPU in % of a core (all of it, and its
    event loop's), its requests by verb (count, mean ms) and on average in flight, and its reconciles
    (count, mean ms) and on average at once."""
    wall, zero = after.at - before.at, (0.0, 0.0)
    requests = {v: _spent(pair, before.requests.get(v, zero)) for v, pair in after.requests.items()}
    reconciles = _spent(after.reconciles, before.reconciles)
    return {
        "seconds": wall,
        "cpu_percent": 100 * (after.cpu - before.cpu) / wall,
        "loop_cpu_percent": 100 * (after.loop_cpu - before.loop_cpu) / wall,
        "requests": {verb: _mean_ms(pair) for verb, pair in sorted(requests.items()) if pair[0]},
        "requests_in_flight": sum(seconds for _, seconds in requests.values()) / wall,
        "reconciles": _mean_ms(reconciles),
        "reconciles_at_once": reconciles[1] / wall,
    }


def _spent(now: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    return now[0] - then[0], now[1] - then[1]


def _mean_ms(spent: tuple[float, float]) -> tuple[float, float]:
    count, seconds = spent
    return count, 1000 * seconds / count if count else 0.0


class PeakRss:
    """The highest RSS of a process, sampled every half second while in the `with` block."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, rss_mib(self.pid) or 0.0)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _samples(metrics_port: int, name: str) -> list[Sample]:
    """The samples called `name` on the operator's metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def reconciles(metrics_port: int) -> float:
    return sum(s.value for s in _samples(metrics_port, "psoperator_reconcile_duration_seconds_count"))


def job_reads(metrics_port: int) -> float:
    """How many times the operator has read a job (GET pstrainingjobs): at rest, once per job in
    each round of its periodic fresh reads."""
    samples = _samples(metrics_port, "psoperator_api_requests_total")
    job = ("GET", "pstrainingjobs")
    return sum(s.value for s in samples if (s.labels["verb"], s.labels["resource"]) == job)


def most_in_a_minute(samples: list[tuple[float, float]]) -> float:
    """The most a counter sampled as (time, value), times in order, rose within any 60 s between
    two of its samples."""
    return max(
        (later - value for i, (at, value) in enumerate(samples) for t, later in samples[i:] if t - at <= 60),
        default=0.0,
    )


def operator_writes(metrics_port: int) -> dict[str, float]:
    """The operator's own count of its writes, by verb and resource ("POST services"): all but
    kopf's (the events it posts)."""
    writes: dict[str, float] = {}
    for s in _samples(metrics_port, "psoperator_api_requests_total"):
        if s.labels["verb"] != "GET":
            request = f"{s.labels['verb']} {s.labels['resource']}"
            writes[request] = writes.get(request, 0.0) + s.value
    return writes


def add_nodes(api: client.ApiClient, pods: int) -> int:
    """Simulated CPU nodes (KWOK) with room for `pods` pods, each with a /16 of loopback pod IPs."""
    core = client.CoreV1Api(api)
    count = -(-pods // NODE_PODS)
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(NODE_PODS)}
    for i in range(count):
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"bench-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "psoperator.io/pool": "cpu",
                    "kubernetes.io/hostname": f"bench-{i}",
                },
            },
            "spec": {"podCIDR": f"127.{100 + i}.0.0/16", "podCIDRs": [f"127.{100 + i}.0.0/16"]},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        try:
            core.create_node(node)  # type: ignore[arg-type]  # the client sends a dict as it is
        except ApiException as error:
            if error.status != 409:
                raise

    def ready(name: str) -> bool:
        conditions = (core.read_node(name).status or client.V1NodeStatus()).conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    wait_for(lambda: all(ready(f"bench-{i}") for i in range(count)), timeout=60, message="bench nodes Ready")
    return count


def remove_nodes(api: client.ApiClient, count: int) -> None:
    """The nodes add_nodes added: the cluster is left as the tests expect it (only its own nodes)."""
    core = client.CoreV1Api(api)
    for i in range(count):
        try:
            core.delete_node(f"bench-{i}")
        except ApiException as error:
            if error.status != 404:
                raise

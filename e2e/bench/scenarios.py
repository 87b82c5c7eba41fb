"""The scenarios: each creates its jobs in a namespace of its own and deletes it afterwards.

Three kinds of the same job (1 chief + P PS + W workers): "ours"; "floor", its children created by
the benchmark itself; "tfjob", a TFJob of Kubeflow's training-operator (`peer.py`). The operator
watches `bench-ours-*` namespaces only; the floor's jobs (created so that their children have an
owner, as the operator's do) live in `bench-floor-*`, which it never sees; the training-operator
watches every namespace, as installed, and acts on TFJobs only (`bench-tfjob-*`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import chaos, psjobs
from e2e.bench import floor, measure, peer
from e2e.bench.podwatch import OURS, PodLabels, PodWatch
from e2e.bench.progress import ChiefProgress
from e2e.operator_process import OperatorProcess
from e2e.util import WaitTimeout, rss_mib, wait_for
from psoperator.control import chief_client
from psoperator.control.state import Config

Obj = dict[str, Any]
CREATORS = 8  # concurrent clients creating the jobs of a burst (the same for ours and the floor)
TIMEOUT = 1800.0
OBSERVE_SECONDS = 15.0  # after the peer's PS are replaced: long enough to see it restart a chief
SCRAPE_SECONDS = 30.0  # the chart's ServiceMonitor's interval (metrics.serviceMonitor.interval)


@dataclass
class Bench:
    api: client.ApiClient
    kubeconfig: Path  # the admin's: metrics, namespaces, chaos
    operator: OperatorProcess
    metrics_port: int
    accounts: dict[str, measure.Account]  # of the kinds run by an operator: "ours", "tfjob"
    memory_report: Path | None = None  # with --trace-memory: where e2e/bench/traced.py writes


def job_manifest(name: str, ps: int, workers: int) -> Obj:
    """1 chief + `ps` PS + `workers` CPU workers, on any simulated node."""
    cpu = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}
    return psjobs.manifest(name, ps={**cpu, "replicas": ps}, worker={**cpu, "replicas": workers})


def namespace(bench: Bench, kind: str) -> str:
    core = client.CoreV1Api(bench.api)
    name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(lambda: core.read_namespaced_service_account("default", name), timeout=60, message="sa")
    return name


def delete_namespace(bench: Bench, name: str) -> None:
    """Delete it and wait until it is gone, so that the next scenario runs on a quiet cluster. Its
    jobs go first: the namespace controller deletes pods before the jobs that own them, and the
    operator would restart every job whose PS pod it saw go (1,000 jobs: 15 minutes of churn)."""
    core = client.CoreV1Api(bench.api)
    client.CustomObjectsApi(bench.api).delete_collection_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, name, psjobs.PLURAL
    )
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as error:
            return bool(error.status == 404)
        return False

    wait_for(gone, timeout=TIMEOUT, interval=1.0, message=f"namespace {name} deleted")


def wait_watching(bench: Bench) -> None:
    """Returns once the operator serves namespaces created after it started. kopf (1.45) lists the
    namespaces, then starts its namespace watch from a listing of its own whose objects it ignores:
    a namespace created between the two, in the operator's first second, is never served. So a job
    in a namespace created now must get a status first (another namespace on each try)."""

    def served() -> bool:
        ns = namespace(bench, "ours-ready")
        try:
            psjobs.create(bench.api, ns, job_manifest("ready", 1, 1))
            wait_for(lambda: psjobs.status(bench.api, ns, "ready").get("phase"), timeout=15, message="status")
            return True
        except WaitTimeout:
            return False
        finally:
            delete_namespace(bench, ns)

    wait_for(served, timeout=180, interval=0, message="the operator serving new namespaces")


def create_all(names: list[str], create: Callable[[str], object]) -> None:
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(create, names))


def create_ours(bench: Bench, ns: str, ps: int, workers: int) -> Callable[[str], None]:
    def create(name: str) -> None:
        psjobs.create(bench.api, ns, job_manifest(name, ps, workers))

    return create


def create_floor(bench: Bench, ns: str, ps: int, workers: int) -> Callable[[str], None]:
    return floor.create(bench.api, ns, lambda name: job_manifest(name, ps, workers))


def create_tfjob(bench: Bench, ns: str, ps: int, workers: int) -> Callable[[str], None]:
    def create(name: str) -> None:
        peer.create_tfjob(bench.api, ns, peer.tfjob_manifest(name, ps, workers))

    return create


FACTORIES = {"ours": create_ours, "floor": create_floor, "tfjob": create_tfjob}
LABELS: dict[str, PodLabels] = {"ours": OURS, "floor": OURS, "tfjob": peer.LABELS}


def settled(bench: Bench, kind: str, ns: str, established: bool = False) -> bool:
    """Whether every job's status says Running (an operator's start-up status writes are done);
    `established`: ours, with its PS established (a PS loss now restarts the chief)."""
    if kind == "tfjob":
        return peer.all_running(bench.api, ns)
    return kind == "floor" or _all_phase(bench, ns, "Running", established)


def _requests(bench: Bench, kind: str) -> measure.Requests:
    account = bench.accounts.get(kind)
    return measure.requests(bench.kubeconfig, account) if account else measure.Requests(0, 0)


def burst(bench: Bench, kind: str, jobs: int) -> dict[str, Any]:
    """`jobs` jobs created at once: seconds from the start of the burst to each job's pods all Running."""
    ns = namespace(bench, kind)
    names = [f"b{i}" for i in range(jobs)]
    try:
        with PodWatch(bench.api, ns, pods_per_job=7, labels=LABELS[kind]) as pods:
            before = _requests(bench, kind)
            started = time.monotonic()
            create_all(names, FACTORIES[kind](bench, ns, 2, 4))
            done = pods.wait_all_running(names, TIMEOUT)
            # An operator's requests until then, and its later status writes (Running).
            wait_for(lambda: settled(bench, kind, ns), timeout=TIMEOUT, interval=1.0, message="Running")
            requests = _requests(bench, kind) - before
    finally:
        delete_namespace(bench, ns)
    counted = kind in bench.accounts
    return {
        "seconds": [done[n] - started for n in names],
        "writes_per_job": requests.writes / jobs if counted else None,
        "requests_per_job": requests.total / jobs if counted else None,
    }


def _all_phase(bench: Bench, ns: str, phase: str, established: bool = False) -> bool:
    listed: Any = client.CustomObjectsApi(bench.api).list_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, ns, psjobs.PLURAL
    )
    statuses = [item.get("status") or {} for item in listed["items"]]
    return all(
        s.get("phase") == phase and (not established or (s.get("tracking") or {}).get("psEstablished"))
        for s in statuses
    )


@dataclass
class RunningJobs:
    namespace: str
    names: list[str]
    pods: PodWatch
    started: float  # when their creation began
    requests: measure.Requests  # the operator's, counted by the API server until then


def start_running(bench: Bench, kind: str, purpose: str, jobs: int, ps: int, workers: int) -> RunningJobs:
    """A namespace with `jobs` jobs of `kind` all Running (ours: every PS ran with the chief, so a
    PS loss now restarts it). The caller closes `pods` and deletes the namespace."""
    ns = namespace(bench, f"{kind}-{purpose}")
    names = [f"j{i}" for i in range(jobs)]
    pods = PodWatch(bench.api, ns, pods_per_job=1 + ps + workers, labels=LABELS[kind]).__enter__()
    requests, started = _requests(bench, kind), time.monotonic()
    create_all(names, FACTORIES[kind](bench, ns, ps, workers))
    pods.wait_all_running(names, TIMEOUT)
    wait_for(lambda: settled(bench, kind, ns, established=True), timeout=TIMEOUT, interval=1.0,
             message="jobs Running (ours: with their PS established)")  # fmt: skip
    return RunningJobs(ns, names, pods, started, requests)


def stop(bench: Bench, jobs: RunningJobs) -> None:
    jobs.pods.__exit__()
    delete_namespace(bench, jobs.namespace)


def fail_ps(bench: Bench, ns: str, names: list[str]) -> dict[str, float]:
    """PS 0 of every job fails (exit 1) at once; returns when each failure was injected."""
    core = client.CoreV1Api(bench.api)
    annotations = {"metadata": {"annotations": {chaos.ANNOTATION_EXIT_CODE: "1"}}}
    failed_at: dict[str, float] = {}

    def fail(name: str) -> None:
        failed_at[name] = time.monotonic()
        core.patch_namespaced_pod(f"{name}-ps-0", ns, annotations, _content_type=chaos.MERGE_PATCH)

    create_all(names, fail)
    return failed_at


def recovery(bench: Bench, kind: str, jobs: int) -> dict[str, Any]:
    """PS 0 of each of `jobs` Running jobs fails at once. Ours and the floor (its requests made by
    the benchmark: floor.Recovery): failure -> new chief pod, and where that time goes. Ours and the
    peer: failure -> a replacement PS 0 Running, and how many jobs had their chief restarted (ours
    restarts every one; the peer has no PS-aware recovery: it is given OBSERVE_SECONDS more to show one)."""
    running = start_running(bench, kind, "recovery", jobs, 2, 4)
    names, pods = running.names, running.pods
    restarting = kind in ("ours", "floor")
    recovering = floor.Recovery(bench.api, running.namespace, pods, lambda job: f"{job}-ps-0")
    try:
        with recovering if kind == "floor" else contextlib.nullcontext():
            before, loaded = set(pods.seen), _load(bench) if kind == "ours" else None
            injected = fail_ps(bench, running.namespace, names)
            result: dict[str, Any] = {}
            if restarting:
                if loaded is not None:  # what the operator did while it decided
                    pods.wait_stopping(names, attempt=0, timeout=TIMEOUT)
                    result["deciding"] = measure.load_between(loaded, _load(bench))
                chiefs = pods.wait_chiefs(names, attempt=1, timeout=TIMEOUT)
                result |= {"seconds": [chiefs[n] - injected[n] for n in names], **_stages(pods, injected)}
            replaced = pods.wait_replaced(before, {n: f"{n}-ps-0" for n in names}, TIMEOUT)
            if not restarting:
                time.sleep(OBSERVE_SECONDS)
            restarted = set(pods.new_pods(before, "chief")) | {job for job, _ in pods.chief_deleting_at}
    finally:
        stop(bench, running)
    ps_seconds = [replaced[n] - injected[n] for n in names]
    return {**result, "ps_replaced_seconds": ps_seconds, "chiefs_restarted": len(restarted), "jobs": jobs}


def _load(bench: Bench) -> measure.Load:
    assert bench.operator.pid is not None
    return measure.load(bench.operator.pid, bench.metrics_port)


def _stages(pods: PodWatch, injected: dict[str, float]) -> dict[str, list[float]]:
    """Where a recovery's time goes: KWOK failing the PS (inject -> PS Failed, as the watch shows
    it), the operator deciding (-> the old chief pod asked to stop), KWOK and the controllers
    removing the old chief and the recycled PS pods (-> the last of them deleted), and the operator
    and the Job controller starting the new chief (-> its pod)."""
    failed, stopping = (
        pods.ps_failed_at,
        {job: t for (job, a), t in pods.chief_deleting_at.items() if a == "0"},
    )
    new = {job: t for (job, a), t in pods.chief_seen_at.items() if a == "1"}
    jobs = [j for j in injected if j in failed and j in stopping and j in new]
    gone = {j: _last_gone(pods, j, stopping[j], new[j]) for j in jobs}
    return {
        "inject_to_ps_failed": [failed[j] - injected[j] for j in jobs],
        "ps_failed_to_chief_stopping": [stopping[j] - failed[j] for j in jobs],
        "chief_stopping_to_old_pods_gone": [gone[j] - stopping[j] for j in jobs],
        "old_pods_gone_to_new_chief": [new[j] - gone[j] for j in jobs],
    }


def _last_gone(pods: PodWatch, job: str, since: float, until: float) -> float:
    """When the last chief or PS pod of `job` deleted between `since` and `until` went (`since`: none)."""
    times = [
        t
        for uid, t in pods.deleted_at.items()
        if pods.seen[uid][0] == job and pods.seen[uid][1] in ("chief", "ps") and since <= t <= until
    ]
    return max(times, default=since)


def _pods(bench: Bench, ns: str, selector: str) -> list[Any]:
    return list(client.CoreV1Api(bench.api).list_namespaced_pod(ns, label_selector=selector).items)


def chief_addresses(bench: Bench, ns: str) -> list[str]:
    chiefs = _pods(bench, ns, f"{psjobs.LABEL_ROLE}=chief")
    return [str(p.status.pod_ip) for p in chiefs if p.status and p.status.pod_ip]


def steady(bench: Bench, jobs: int, seconds: float, read_round: bool = False) -> dict[str, Any]:
    """`jobs` Running jobs left alone, first with no progress endpoint (as on KWOK), then with chiefs
    that report a step that moves at every poll: what the operator costs at rest and in training;
    then at rest again after the operator restarted (an upgrade, a rescheduled pod). With
    `read_round`, the window at rest goes on until the operator has read every job once more: one
    round of the periodic fresh reads, which come every Config.fresh_read_interval (at 1,000 jobs,
    every 2,000 s), is in it."""
    running = start_running(bench, "ours", "steady", jobs, 2, 4)
    try:
        time.sleep(15)  # the last status writes of start-up
        idle = _window(bench, jobs, seconds, None, reads=jobs if read_round else 0)
        trace_memory(bench, f"{jobs}-jobs-at-rest")
        with ChiefProgress() as progress:
            addresses = chief_addresses(bench, running.namespace)
            progress.serve(addresses)
            # A chief that refused is asked again after up to 5 minutes (psoperator.control.chief_client).
            wait_for(lambda: progress.asked >= set(addresses), interval=1.0,
                     timeout=chief_client.MAX_WAIT_SECONDS + TIMEOUT,
                     message="every chief asked for its progress")  # fmt: skip
            training = _window(bench, jobs, seconds, progress)
        restarted = _restarted(bench, jobs, seconds)
        trace_memory(bench, f"{jobs}-jobs-after-a-restart")
    finally:
        stop(bench, running)
    return {"idle": idle, "training": training, "after a restart": restarted}


def trace_memory(bench: Bench, label: str) -> None:
    """With --trace-memory: the operator's report of where its memory was allocated, kept as
    memory-LABEL.txt beside it (e2e/bench/traced.py)."""
    if bench.memory_report is None:
        return
    bench.memory_report.unlink(missing_ok=True)
    assert bench.operator.pid is not None
    os.kill(bench.operator.pid, signal.SIGUSR2)
    wait_for(bench.memory_report.exists, timeout=TIMEOUT, interval=1.0, message="the memory report")
    kept = bench.memory_report.rename(bench.memory_report.with_name(f"memory-{label}.txt"))
    print(f"where the operator's memory is, {label}: {kept}", flush=True)


def _restarted(bench: Bench, jobs: int, seconds: float) -> dict[str, float]:
    """The operator stopped and started again on `jobs` Running jobs: its peak RSS until it has
    reconciled every job once and 30 s more, then a window at rest."""
    bench.operator.stop()
    bench.operator.launch()
    pid = bench.operator.pid
    assert pid is not None
    with measure.PeakRss(pid) as rss:
        bench.operator.wait_live()
        wait_for(lambda: measure.reconciles(bench.metrics_port) >= jobs, timeout=TIMEOUT, interval=1.0,
                 message="every job reconciled after the restart")  # fmt: skip
        time.sleep(30)
    return {**_window(bench, jobs, seconds, None), "peak_rss_mib": rss.peak}


def _window(
    bench: Bench, jobs: int, seconds: float, progress: ChiefProgress | None, reads: int = 0
) -> dict[str, float]:
    """The operator's RSS at the end of `seconds`, and its CPU, requests, reconciles and progress
    polls over them, its metrics scraped as Prometheus would; with `reads`, over as long as it took
    to read a job that many times too, and the most jobs it read in a minute."""
    pid = bench.operator.pid
    assert pid is not None
    requests, cpu = _requests(bench, "ours"), measure.cpu_seconds(pid)
    count, fetches = measure.reconciles(bench.metrics_port), progress.requests if progress else 0
    started = time.monotonic()
    # Jobs read together come due together an interval later, then are read in turn at the reads'
    # pace, which reads them all within another interval.
    scraped = _scraped(bench, seconds, reads, 2 * Config().fresh_read_interval(jobs) + TIMEOUT)
    seconds = time.monotonic() - started
    requests = _requests(bench, "ours") - requests
    per_job_minute = 60 / seconds / jobs
    cpu, reconciles = measure.cpu_seconds(pid) - cpu, measure.reconciles(bench.metrics_port) - count
    return {
        "seconds": seconds,
        "rss_mib": rss_mib(pid) or 0.0,
        "cpu_percent": 100 * cpu / seconds,
        # everything the process did over the window (fresh reads, kopf, metrics) per reconcile
        "cpu_ms_per_reconcile": 1000 * cpu / reconciles if reconciles else 0.0,
        "requests_per_job_minute": requests.total * per_job_minute,
        "writes_per_job_minute": requests.writes * per_job_minute,
        "reconciles_per_job_minute": reconciles * per_job_minute,
        "progress_fetches_per_job_minute": ((progress.requests if progress else 0) - fetches)
        * per_job_minute,
        **({"job_reads_peak_per_minute": measure.most_in_a_minute(scraped)} if reads else {}),
    }


def _scraped(bench: Bench, seconds: float, reads: int, timeout: float) -> list[tuple[float, float]]:
    """Scrapes the operator's metrics every SCRAPE_SECONDS, as Prometheus does with the chart's
    ServiceMonitor, for `seconds` and until it has read a job `reads` times since; returns (time,
    reads of a job so far) at each scrape."""
    started = time.monotonic()
    scraped = [(started, measure.job_reads(bench.metrics_port))]
    while time.monotonic() - started < seconds or scraped[-1][1] - scraped[0][1] < reads:
        if time.monotonic() - started > timeout:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {reads} reads of a job")
        time.sleep(SCRAPE_SECONDS - (time.monotonic() - started) % SCRAPE_SECONDS)
        scraped.append((time.monotonic(), measure.job_reads(bench.metrics_port)))
    return scraped


def big(bench: Bench, ps: int, workers: int) -> dict[str, Any]:
    """One job of `ps` PS and `workers` workers: start-up, a PS failure, the operator's peak RSS."""
    pid = bench.operator.pid
    assert pid is not None
    with measure.PeakRss(pid) as rss:
        running = start_running(bench, "ours", "big", 1, ps, workers)
        name = running.names[0]
        try:
            startup = running.pods.all_running_at[name] - running.started
            injected = fail_ps(bench, running.namespace, running.names)
            recovered = (
                running.pods.wait_chiefs(running.names, attempt=1, timeout=TIMEOUT)[name] - injected[name]
            )
        finally:
            stop(bench, running)
    stages = {k: v[0] for k, v in _stages(running.pods, injected).items() if v}
    return {"startup_seconds": startup, "recovery_seconds": recovered, "peak_rss_mib": rss.peak, **stages}


def _finish(bench: Bench, ns: str) -> None:
    """Every chief exits 0; returns once every job is Succeeded and no pod runs any more (the
    operator's clean-up of the parameter servers and workers is part of the lifecycle)."""
    chiefs = [p.metadata.name for p in _pods(bench, ns, f"{psjobs.LABEL_ROLE}=chief")]
    create_all(chiefs, lambda pod: chaos.annotate_exit(bench.api, ns, pod, 0))
    wait_for(lambda: _all_phase(bench, ns, "Succeeded"), timeout=TIMEOUT, interval=1.0, message="Succeeded")
    wait_for(
        lambda: not [p for p in _pods(bench, ns, psjobs.LABEL_JOB) if p.status.phase == "Running"],
        timeout=TIMEOUT,
        interval=1.0,
        message="no pod Running after the jobs succeeded",
    )


def lifecycle(bench: Bench, jobs: int) -> dict[str, Any]:
    """`jobs` jobs from creation to deletion: Running with their PS established, every chief exits
    0, Succeeded, deleted. The operator's API requests per job over the whole lifecycle, and its
    writes by verb and resource as it counted them itself (the rest of the writes are kopf's events)."""
    counted_before = measure.operator_writes(bench.metrics_port)
    running = start_running(bench, "ours", "lifecycle", jobs, 2, 4)
    custom = client.CustomObjectsApi(bench.api)
    try:
        _finish(bench, running.namespace)
        time.sleep(5)  # a finished job's last status write
        create_all(
            running.names,
            lambda name: custom.delete_namespaced_custom_object(
                psjobs.GROUP, psjobs.VERSION, running.namespace, psjobs.PLURAL, name
            ),
        )
        wait_for(lambda: not _pods(bench, running.namespace, psjobs.LABEL_JOB), timeout=TIMEOUT,
                 interval=1.0, message="the jobs' pods gone")  # fmt: skip
        requests = _requests(bench, "ours") - running.requests
        counted = measure.operator_writes(bench.metrics_port)
    finally:
        stop(bench, running)
    by_request = {r: (n - counted_before.get(r, 0.0)) / jobs for r, n in sorted(counted.items())}
    return {
        "writes_per_job": requests.writes / jobs,
        "requests_per_job": requests.total / jobs,
        "writes_per_job_by_request": {r: n for r, n in by_request.items() if n},
    }

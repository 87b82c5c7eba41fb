"""Prometheus metrics of the operator, on a registry made at start-up (not at import).

What they show of a job is computed by readings.py; this module keeps each job's latest reading,
from which its series are read when scraped, and drops it when the job is deleted, so deleted jobs
leave nothing behind (and a thousand jobs' series are no objects of their own). The
counters of a namespace (jobs created, succeeded, failed, restarted) stay: they are bounded by the
namespaces, not the jobs. No label holds a pod's name.

`Metrics().reference` lists every metric as registered: docs/reference/metrics.md is generated from it
(`psoperator metrics --write`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from psoperator.api.vocabulary import Phase
from psoperator.metrics.readings import JobReading, carried
from psoperator.observe.cache import JobKey

PHASES: tuple[str, ...] = tuple(str(phase) for phase in Phase)
OUTCOMES = ("ok", "error")
# A job is `psjob` (kubectl's short name), not `job`: Prometheus gives every scraped series a `job`
# label of its own (the scrape job's), which would rename ours to `exported_job`.
NAMESPACE, JOB = ("namespace",), ("namespace", "psjob")
# Seconds: a reconcile or an API request takes milliseconds; recovery and start-up take seconds to
# minutes.
RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SLOW_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as scraped: counters end in _total
    type: str
    labels: tuple[str, ...]
    help: str


class Metrics:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self.reference: list[MetricDoc] = []
        self.scraped: list[MetricDoc] = []  # those of the reference read from the readings when scraped
        # The latest reading of each job (what no news left out carried over from the one before),
        # and its pod restarts so far by (role, reason): its series, read when scraped.
        self.readings: dict[JobKey, JobReading] = {}
        self.pod_restarts: dict[JobKey, dict[tuple[str, str], int]] = {}
        self._jobs_metrics()
        self._job_metrics()
        self._operator_metrics()
        self.registry.register(_ReadingsCollector(self, clock))

    def _jobs_metrics(self) -> None:
        self.jobs_created = self._counter(
            "psoperator_jobs_created", "Jobs whose children the operator created.", NAMESPACE
        )
        self.jobs_succeeded = self._counter("psoperator_jobs_succeeded", "Jobs that succeeded.", NAMESPACE)
        self.jobs_failed = self._counter(
            "psoperator_jobs_failed",
            "Jobs that failed, by the reason of their Failed condition.",
            (*NAMESPACE, "reason"),
        )
        self.jobs_restarted = self._counter(
            "psoperator_jobs_restarted",
            "Coordinated restarts of a chief from the latest checkpoint, by reason "
            "(ParameterServerLost, ChiefFailed).",
            (*NAMESPACE, "reason"),
        )
        self.startup_seconds = self._histogram(
            "psoperator_job_startup_seconds",
            "From a job's creation to the first time every one of its pods runs.",
            NAMESPACE,
            SLOW_BUCKETS,
        )
        self._scraped("psoperator_jobs", "gauge", (*NAMESPACE, "phase"), "Jobs by phase.")

    def _job_metrics(self) -> None:
        """The per-job gauges are read from each job's latest reading when scraped (_ReadingsCollector):
        a job's series are its reading, and forgetting the job is dropping it."""
        self._scraped(
            "psoperator_job_phase",
            "gauge",
            (*JOB, "phase"),
            "1 for the phase the job is in, 0 for the others.",
        )
        self._scraped(
            "psoperator_job_replicas_desired", "gauge", (*JOB, "role"), "Tasks of the role the spec asks for."
        )
        self._scraped(
            "psoperator_job_replicas_ready", "gauge", (*JOB, "role"), "Pods of the role that are Ready."
        )
        self._scraped(
            "psoperator_job_replicas_running", "gauge", (*JOB, "role"), "Pods of the role that are Running."
        )
        self._scraped(
            "psoperator_job_replicas_restarts",
            "gauge",
            (*JOB, "role"),
            "Container restarts and pod replacements of the role since the job's creation (its status: an "
            "operator restart does not reset it).",
        )
        self._scraped(
            "psoperator_job_pod_restarts_total",
            "counter",
            (*JOB, "role", "reason"),
            "Pod failures and restarts of the job's tasks, by role and reason (Error, OOMKilled, Evicted, "
            "Preempted, NodeLost, ...).",
        )
        self._scraped("psoperator_job_step", "gauge", JOB, "Latest global step reported by the chief.")
        self._scraped(
            "psoperator_job_step_rate",
            "gauge",
            JOB,
            "Global steps per second between the last two steps reported; 0 once the step has not moved "
            "for a minute.",
        )
        self._scraped("psoperator_job_checkpoint_step", "gauge", JOB, "Global step of the latest checkpoint.")
        self._scraped(
            "psoperator_job_checkpoint_age_seconds",
            "gauge",
            JOB,
            "Seconds since the latest checkpoint was written.",
        )
        self._scraped(
            "psoperator_job_checkpoint_interval_steps",
            "gauge",
            JOB,
            "spec.checkpoint.intervalSteps, when set.",
        )
        self._scraped(
            "psoperator_job_checkpoint_interval_seconds",
            "gauge",
            JOB,
            "spec.checkpoint.intervalSeconds, when set.",
        )
        self._scraped(
            "psoperator_job_counted_restarts",
            "gauge",
            JOB,
            "Restarts counted against spec.failurePolicy.maxRestarts (a newer checkpoint resets them).",
        )
        self._scraped("psoperator_job_max_restarts", "gauge", JOB, "spec.failurePolicy.maxRestarts.")
        self.recovery_seconds = self._histogram(
            "psoperator_job_recovery_seconds",
            "From a failure that restarts the chief (the pod's termination, disruption or deletion, in "
            "whole seconds as the API gives them) to the chief and every parameter server running again.",
            JOB,
            SLOW_BUCKETS,
        )

    def _operator_metrics(self) -> None:
        self.reconciles = self._counter(
            "psoperator_reconciles", "Reconciles of jobs, by outcome (ok, error).", ("outcome",)
        )
        self.reconcile_duration = self._histogram(
            "psoperator_reconcile_duration_seconds",
            "Duration of one reconcile, by outcome.",
            ("outcome",),
            RECONCILE_BUCKETS,
        )
        self.api_requests = self._counter(
            "psoperator_api_requests",
            "Kubernetes API requests of the reconciles and of leader election, by HTTP method, resource "
            "(pods, statefulsets, pstrainingjobs/status, ...) and status code (none: no response). Not "
            "kopf's watches and events. Some 404s and 409s are expected (a job read after its deletion).",
            ("verb", "resource", "code"),
        )
        self.api_request_duration = self._histogram(
            "psoperator_api_request_duration_seconds",
            "Duration of the requests of psoperator_api_requests_total, by HTTP method and resource: "
            "from sending one to the end of its answer, the client's retries included.",
            ("verb", "resource"),
            RECONCILE_BUCKETS,
        )
        self.jobs_managed = self._gauge(
            "psoperator_jobs_managed", "Jobs the operator runs a reconcile loop for.", ()
        )
        self.leader = self._gauge(
            "psoperator_leader",
            "1 while this replica holds the leader Lease and runs the jobs (always 1 without leader "
            "election), 0 while it stands by.",
            (),
        )
        for outcome in OUTCOMES:  # present from the start, so that rate() sees the first error
            self.reconciles.labels(outcome)
            self.reconcile_duration.labels(outcome)

    def _doc(self, name: str, type_: str, labels: Sequence[str], help_: str) -> None:
        self.reference.append(MetricDoc(name, type_, tuple(labels), help_))

    def _scraped(self, name: str, type_: str, labels: Sequence[str], help_: str) -> None:
        """A metric read from the readings when scraped (_ReadingsCollector), not kept on the registry."""
        self._doc(name, type_, labels, help_)
        self.scraped.append(self.reference[-1])

    def _counter(self, name: str, help_: str, labels: Sequence[str]) -> Counter:
        self._doc(f"{name}_total", "counter", labels, help_)
        return Counter(name, help_, labels, registry=self.registry)

    def _gauge(self, name: str, help_: str, labels: Sequence[str]) -> Gauge:
        self._doc(name, "gauge", labels, help_)
        return Gauge(name, help_, labels, registry=self.registry)

    def _histogram(self, name: str, help_: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
        self._doc(name, "histogram", labels, help_)
        return Histogram(name, help_, labels, buckets=buckets, registry=self.registry)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def reconciled(self, outcome: str, seconds: float) -> None:
        self.reconciles.labels(outcome).inc()
        self.reconcile_duration.labels(outcome).observe(seconds)

    def api_request(self, verb: str, resource: str, code: str, seconds: float) -> None:
        self.api_requests.labels(verb, resource, code).inc()
        self.api_request_duration.labels(verb, resource).observe(seconds)

    def record(self, namespace: str, job: str, reading: JobReading) -> None:
        """A job's reading after a reconcile whose status write succeeded: what happened is counted,
        and the reading is kept for the job's gauges, what it has no news of as the last one said."""
        key = (namespace, job)
        self._count(namespace, job, reading)
        self.readings[key] = carried(self.readings.get(key), reading)
        if reading.failures:
            restarts = self.pod_restarts.setdefault(key, {})
            for failure in reading.failures:
                restarts[failure] = restarts.get(failure, 0) + 1

    def _count(self, namespace: str, job: str, reading: JobReading) -> None:
        """What happened in this reconcile."""
        if reading.created:
            self.jobs_created.labels(namespace).inc()
        if reading.succeeded:
            self.jobs_succeeded.labels(namespace).inc()
        if reading.failed_reason is not None:
            self.jobs_failed.labels(namespace, reading.failed_reason).inc()
        if reading.restarted_reason is not None:
            self.jobs_restarted.labels(namespace, reading.restarted_reason).inc()
        if reading.startup_seconds is not None:
            self.startup_seconds.labels(namespace).observe(reading.startup_seconds)
        if reading.recovery_seconds is not None:
            self.recovery_seconds.labels(namespace, job).observe(reading.recovery_seconds)

    def forget(self, namespace: str, job: str) -> None:
        """The job is gone: so is every series that names it (without a scan of the other jobs')."""
        self.readings.pop((namespace, job), None)
        self.pod_restarts.pop((namespace, job), None)
        self.recovery_seconds.remove(namespace, job)


def job_samples(reading: JobReading, now: float) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """Each per-job gauge the reading shows: (metric, its labels after namespace and psjob, value)."""
    for phase in PHASES:
        yield "psoperator_job_phase", (phase,), 1.0 if phase == reading.phase else 0.0
    for role, counts in reading.replicas.items():
        yield "psoperator_job_replicas_desired", (role,), counts.desired
        yield "psoperator_job_replicas_ready", (role,), counts.ready
        yield "psoperator_job_replicas_running", (role,), counts.running
        yield "psoperator_job_replicas_restarts", (role,), counts.restarts
    optional = (
        ("psoperator_job_step", reading.step),
        ("psoperator_job_step_rate", reading.step_rate),
        ("psoperator_job_checkpoint_step", reading.checkpoint_step),
        ("psoperator_job_checkpoint_interval_steps", reading.checkpoint_interval_steps),
        ("psoperator_job_checkpoint_interval_seconds", reading.checkpoint_interval_seconds),
        ("psoperator_job_counted_restarts", reading.counted_restarts),
        ("psoperator_job_max_restarts", reading.max_restarts),
    )
    for name, value in optional:
        if value is not None:
            yield name, (), value
    if reading.checkpoint_time is not None:
        yield "psoperator_job_checkpoint_age_seconds", (), max(now - reading.checkpoint_time, 0.0)


class _ReadingsCollector(Collector):
    """What is computed at scrape time from the latest readings: jobs by phase, and every job's
    gauges and pod restarts (a thousand jobs' series cost no objects of their own)."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.clock = clock

    def _family(self, doc: MetricDoc) -> GaugeMetricFamily | CounterMetricFamily:
        family = CounterMetricFamily if doc.type == "counter" else GaugeMetricFamily
        return family(doc.name, doc.help, labels=doc.labels)

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        readings = dict(metrics.readings)  # reconciles may add to it meanwhile
        restarts = {key: dict(counts) for key, counts in list(metrics.pod_restarts.items())}
        families = {doc.name: self._family(doc) for doc in metrics.scraped}
        counts: dict[tuple[str, str], int] = {}
        for (namespace, _), reading in readings.items():
            counts[(namespace, reading.phase)] = counts.get((namespace, reading.phase), 0) + 1
        for (namespace, phase), count in sorted(counts.items()):
            families["psoperator_jobs"].add_metric([namespace, phase], count)
        now = self.clock()
        for (namespace, job), reading in sorted(readings.items()):
            for name, labels, value in job_samples(reading, now):
                families[name].add_metric([namespace, job, *labels], value)
        for (namespace, job), by_failure in sorted(restarts.items()):
            for (role, reason), count in sorted(by_failure.items()):
                families["psoperator_job_pod_restarts_total"].add_metric(
                    [namespace, job, role, reason], count
                )
        yield from families.values()

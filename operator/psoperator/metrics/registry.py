"""Prometheus metrics of the operator, on a registry made at start-up (not at import).

What they show of a job is computed by readings.py; this module puts it on the registry and takes
every series of a job off when the job is deleted, so deleted jobs leave nothing behind. The
counters of a namespace (jobs created, succeeded, failed, restarted) stay: they are bounded by the
namespaces, not the jobs. No label holds a pod's name.

`Metrics().reference` lists every metric as registered: docs/metrics.md is generated from it
(`psoperator metrics --write`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from psoperator.api.vocabulary import Phase
from psoperator.metrics.readings import JobReading

PHASES: tuple[str, ...] = tuple(Phase)
OUTCOMES = ("ok", "error")
# A job is `psjob` (kubectl's short name), not `job`: Prometheus gives every scraped series a `job`
# label of its own (the scrape job's), which would rename ours to `exported_job`.
NAMESPACE, JOB = ("namespace",), ("namespace", "psjob")
# Seconds: a reconcile takes milliseconds; recovery and start-up take seconds to minutes.
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
        self.per_job: list[MetricWrapperBase] = []  # every metric labelled by job: forgotten with it
        self.readings: dict[tuple[str, str], JobReading] = {}  # the latest of each job
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
        self._doc("psoperator_jobs", "gauge", (*NAMESPACE, "phase"), "Jobs by phase.")

    def _job_metrics(self) -> None:
        self.phase = self._gauge(
            "psoperator_job_phase", "1 for the phase the job is in, 0 for the others.", (*JOB, "phase")
        )
        self.replicas_desired = self._gauge(
            "psoperator_job_replicas_desired", "Tasks of the role the spec asks for.", (*JOB, "role")
        )
        self.replicas_ready = self._gauge(
            "psoperator_job_replicas_ready", "Pods of the role that are Ready.", (*JOB, "role")
        )
        self.replicas_running = self._gauge(
            "psoperator_job_replicas_running", "Pods of the role that are Running.", (*JOB, "role")
        )
        self.replicas_restarts = self._gauge(
            "psoperator_job_replicas_restarts",
            "Container restarts and pod replacements of the role since the job's creation (its status: an "
            "operator restart does not reset it).",
            (*JOB, "role"),
        )
        self.pod_restarts = self._counter(
            "psoperator_job_pod_restarts",
            "Pod failures and restarts of the job's tasks, by role and reason (Error, OOMKilled, Evicted, "
            "Preempted, NodeLost, ...).",
            (*JOB, "role", "reason"),
        )
        self.step = self._gauge("psoperator_job_step", "Latest global step reported by the chief.", JOB)
        self.step_rate = self._gauge(
            "psoperator_job_step_rate",
            "Global steps per second between the last two steps reported; 0 once the step has not moved "
            "for a minute.",
            JOB,
        )
        self.checkpoint_step = self._gauge(
            "psoperator_job_checkpoint_step", "Global step of the latest checkpoint.", JOB
        )
        self._doc(
            "psoperator_job_checkpoint_age_seconds",
            "gauge",
            JOB,
            "Seconds since the latest checkpoint was written.",
        )
        self.interval_steps = self._gauge(
            "psoperator_job_checkpoint_interval_steps", "spec.checkpoint.intervalSteps, when set.", JOB
        )
        self.interval_seconds = self._gauge(
            "psoperator_job_checkpoint_interval_seconds", "spec.checkpoint.intervalSeconds, when set.", JOB
        )
        self.counted_restarts = self._gauge(
            "psoperator_job_counted_restarts",
            "Restarts counted against spec.failurePolicy.maxRestarts (a newer checkpoint resets them).",
            JOB,
        )
        self.max_restarts = self._gauge("psoperator_job_max_restarts", "spec.failurePolicy.maxRestarts.", JOB)
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

    def _keep(self, metric: MetricWrapperBase, labels: Sequence[str]) -> None:
        if "psjob" in labels:
            self.per_job.append(metric)

    def _counter(self, name: str, help_: str, labels: Sequence[str]) -> Counter:
        self._doc(f"{name}_total", "counter", labels, help_)
        metric = Counter(name, help_, labels, registry=self.registry)
        self._keep(metric, labels)
        return metric

    def _gauge(self, name: str, help_: str, labels: Sequence[str]) -> Gauge:
        self._doc(name, "gauge", labels, help_)
        metric = Gauge(name, help_, labels, registry=self.registry)
        self._keep(metric, labels)
        return metric

    def _histogram(self, name: str, help_: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
        self._doc(name, "histogram", labels, help_)
        metric = Histogram(name, help_, labels, buckets=buckets, registry=self.registry)
        self._keep(metric, labels)
        return metric

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def reconciled(self, outcome: str, seconds: float) -> None:
        self.reconciles.labels(outcome).inc()
        self.reconcile_duration.labels(outcome).observe(seconds)

    def api_request(self, verb: str, resource: str, code: str) -> None:
        self.api_requests.labels(verb, resource, code).inc()

    def record(self, namespace: str, job: str, reading: JobReading) -> None:
        """A job's reading after a reconcile whose status write succeeded. Its gauges are set only
        when it differs from the job's last reading (a Running job's reconciles mostly read the same)."""
        last = self.readings.get((namespace, job))
        self.readings[(namespace, job)] = reading
        self._count(namespace, job, reading)
        if reading == last:
            return
        for phase in PHASES:
            self.phase.labels(namespace, job, phase).set(1 if phase == reading.phase else 0)
        for role, counts in reading.replicas.items():
            self.replicas_desired.labels(namespace, job, role).set(counts.desired)
            self.replicas_ready.labels(namespace, job, role).set(counts.ready)
            self.replicas_running.labels(namespace, job, role).set(counts.running)
            self.replicas_restarts.labels(namespace, job, role).set(counts.restarts)
        optional = (
            (self.step, reading.step),
            (self.step_rate, reading.step_rate),
            (self.checkpoint_step, reading.checkpoint_step),
            (self.interval_steps, reading.checkpoint_interval_steps),
            (self.interval_seconds, reading.checkpoint_interval_seconds),
            (self.counted_restarts, reading.counted_restarts),
            (self.max_restarts, reading.max_restarts),
        )
        for gauge, value in optional:
            if value is not None:
                gauge.labels(namespace, job).set(value)

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
        for role, reason in reading.failures:
            self.pod_restarts.labels(namespace, job, role, reason).inc()

    def forget(self, namespace: str, job: str) -> None:
        """The job is gone: so is every series that names it."""
        self.readings.pop((namespace, job), None)
        for metric in self.per_job:
            metric.remove_by_labels({"namespace": namespace, "psjob": job})


class _ReadingsCollector(Collector):
    """What is computed at scrape time from the latest readings: jobs by phase, checkpoint ages."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.clock = clock

    def _family(self, name: str) -> GaugeMetricFamily:
        doc = next(d for d in self.metrics.reference if d.name == name)
        return GaugeMetricFamily(doc.name, doc.help, labels=doc.labels)

    def collect(self) -> Iterator[Metric]:
        readings = dict(self.metrics.readings)  # reconciles may add to it meanwhile
        by_phase = self._family("psoperator_jobs")
        counts: dict[tuple[str, str], int] = {}
        for (namespace, _), reading in readings.items():
            counts[(namespace, reading.phase)] = counts.get((namespace, reading.phase), 0) + 1
        for labels, count in sorted(counts.items()):
            by_phase.add_metric(list(labels), count)
        ages = self._family("psoperator_job_checkpoint_age_seconds")
        now = self.clock()
        for (namespace, job), reading in sorted(readings.items()):
            if reading.checkpoint_time is not None:
                ages.add_metric([namespace, job], max(now - reading.checkpoint_time, 0.0))
        yield by_phase
        yield ages

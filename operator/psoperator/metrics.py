"""Prometheus metrics of the operator, registered on a registry made at start-up (not at import)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from psoperator.vocabulary import Phase

PHASES: tuple[str, ...] = tuple(Phase)


@dataclass
class Metrics:
    registry: CollectorRegistry
    reconciles: Counter
    reconcile_seconds: Histogram
    restarts: Counter
    failures: Counter
    phase: Gauge
    step: Gauge
    recovery_seconds: Histogram

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            reconciles=Counter(
                "psoperator_reconciles", "Reconciles of PSTrainingJobs.", ["result"], registry=registry
            ),
            reconcile_seconds=Histogram(
                "psoperator_reconcile_seconds", "Duration of one reconcile.", registry=registry
            ),
            restarts=Counter(
                "psoperator_restarts",
                "Coordinated restarts from the latest checkpoint.",
                ["namespace", "job", "reason"],
                registry=registry,
            ),
            failures=Counter(
                "psoperator_pod_failures",
                "Pod failures observed, by role and reason.",
                ["namespace", "job", "role", "reason"],
                registry=registry,
            ),
            phase=Gauge(
                "psoperator_job_phase",
                "1 for the phase each job is in.",
                ["namespace", "job", "phase"],
                registry=registry,
            ),
            step=Gauge(
                "psoperator_job_step",
                "Latest global step reported by the chief.",
                ["namespace", "job"],
                registry=registry,
            ),
            recovery_seconds=Histogram(
                "psoperator_recovery_seconds",
                "From seeing a failure to the new chief Job being created.",
                buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
                registry=registry,
            ),
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def set_phase(self, namespace: str, job: str, phase: str) -> None:
        for candidate in PHASES:
            self.phase.labels(namespace, job, candidate).set(1 if candidate == phase else 0)

    def forget(self, namespace: str, job: str) -> None:
        series = [(self.phase, (namespace, job, p)) for p in PHASES] + [(self.step, (namespace, job))]
        for metric, labels in series:
            with contextlib.suppress(KeyError):
                metric.remove(*labels)

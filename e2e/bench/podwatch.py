"""The pods of one namespace as a watch delivers them, stamped with the time each event arrived.

Raw JSON lines, not the client's models: thousands of pods are parsed by the benchmark while the
operator runs on the same cores.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from e2e.psjobs import LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE
from e2e.util import wait_for

Obj = dict[str, Any]


@dataclass(frozen=True)
class PodLabels:
    """The labels that name a pod's job, role ("chief", "ps", "worker") and chief attempt."""

    job: str
    role: str
    attempt: str = ""  # none: every chief pod is of attempt ""


OURS = PodLabels(LABEL_JOB, LABEL_ROLE, LABEL_ATTEMPT)


class PodWatch:
    """When each job first had `pods_per_job` pods Running, when a PS of it was first seen Failed,
    when its chief pods of an attempt were first seen being deleted, when each attempt appeared,
    and each pod (by uid) and when it was first Running and when it was deleted."""

    def __init__(
        self, api: client.ApiClient, namespace: str, pods_per_job: int, labels: PodLabels = OURS
    ) -> None:
        self.api, self.namespace, self.pods_per_job, self.labels = api, namespace, pods_per_job, labels
        self.running: dict[str, set[str]] = defaultdict(set)  # job -> names of its Running pods
        self.all_running_at: dict[str, float] = {}
        self.chief_seen_at: dict[tuple[str, str], float] = {}  # (job, attempt) -> first event
        self.chief_deleting_at: dict[tuple[str, str], float] = {}
        self.ps_failed_at: dict[str, float] = {}
        self.seen: dict[str, tuple[str, str, str]] = {}  # uid -> (job, role, name)
        self.running_at: dict[str, float] = {}  # uid -> first seen Running
        self.deleted_at: dict[str, float] = {}  # uid -> its DELETED event
        self._response: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"podwatch-{namespace}", daemon=True)

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        if self._response is not None:
            self._response.close()

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        since: str | None = None
        while not self._stopped.is_set():
            self._response = core.list_namespaced_pod(
                self.namespace, label_selector=self.labels.job, watch=True, resource_version=since,
                allow_watch_bookmarks=True, timeout_seconds=120, _preload_content=False,
            )  # fmt: skip
            try:
                for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                    event = json.loads(line)
                    since = self._see(event["type"], event["object"], time.monotonic())
            except Exception:  # closed by __exit__, or a dropped connection: watch again
                if self._stopped.is_set():
                    return

    def _see(self, kind: str, pod: Obj, now: float) -> str | None:
        meta = pod.get("metadata", {})
        if kind == "ERROR":  # the version is too old: list again from now
            return None
        if kind == "BOOKMARK":
            return str(meta.get("resourceVersion"))
        labels, key = meta.get("labels", {}), self.labels
        job, name, uid = labels.get(key.job, ""), meta.get("name", ""), meta.get("uid", "")
        role, attempt, phase = (
            labels.get(key.role),
            labels.get(key.attempt, "") if key.attempt else "",
            pod.get("status", {}).get("phase"),
        )
        self.seen.setdefault(uid, (job, str(role), name))
        if kind == "DELETED":
            self.deleted_at[uid] = now
        if role == "chief":
            self.chief_seen_at.setdefault((job, attempt), now)
            if meta.get("deletionTimestamp"):
                self.chief_deleting_at.setdefault((job, attempt), now)
        if role == "ps" and phase == "Failed":
            self.ps_failed_at.setdefault(job, now)
        running = phase == "Running" and not meta.get("deletionTimestamp")
        if running and kind != "DELETED":
            self.running[job].add(name)
            self.running_at.setdefault(uid, now)
        else:
            self.running[job].discard(name)
        if len(self.running[job]) >= self.pods_per_job:
            self.all_running_at.setdefault(job, now)
        return str(meta.get("resourceVersion"))

    def wait_all_running(self, jobs: list[str], timeout: float) -> dict[str, float]:
        wait_for(
            lambda: all(j in self.all_running_at for j in jobs),
            timeout=timeout,
            interval=0.5,
            message=lambda: f"{len(jobs) - len(set(jobs) & set(self.all_running_at))} jobs not all Running",
        )
        return {j: self.all_running_at[j] for j in jobs}

    def wait_chiefs(self, jobs: list[str], attempt: int, timeout: float) -> dict[str, float]:
        """When each job's chief pod of `attempt` was first seen."""
        return self._wait_attempt(self.chief_seen_at, jobs, attempt, timeout, "chief pods")

    def wait_stopping(self, jobs: list[str], attempt: int, timeout: float) -> dict[str, float]:
        """When each job's chief pod of `attempt` was first seen being deleted."""
        return self._wait_attempt(self.chief_deleting_at, jobs, attempt, timeout, "chief pods deleted")

    @staticmethod
    def _wait_attempt(
        at: dict[tuple[str, str], float], jobs: list[str], attempt: int, timeout: float, what: str
    ) -> dict[str, float]:
        key = str(attempt)
        wait_for(
            lambda: all((j, key) in at for j in jobs),
            timeout=timeout,
            interval=0.1,
            message=f"{what}, attempt {attempt}",
        )
        return {j: at[(j, key)] for j in jobs}

    def new_pods(self, before: set[str], role: str) -> dict[str, list[str]]:
        """The names of the pods of `role` not among the uids `before`, by job."""
        found: dict[str, list[str]] = defaultdict(list)
        for uid, (job, pod_role, name) in list(self.seen.items()):
            if uid not in before and pod_role == role:
                found[job].append(name)
        return found

    def wait_replaced(self, before: set[str], names: dict[str, str], timeout: float) -> dict[str, float]:
        """When, for each job, a pod named `names[job]` and not among the uids `before` was first
        Running: a replacement of that pod."""

        def replaced(job: str) -> float | None:
            times = [
                at
                for uid, at in list(self.running_at.items())
                if uid not in before and self.seen[uid][0] == job and self.seen[uid][2] == names[job]
            ]
            return min(times, default=None)

        wait_for(
            lambda: all(replaced(j) is not None for j in names),
            timeout=timeout,
            interval=0.2,
            message=lambda: f"replacements of {sum(replaced(j) is None for j in names)} pods Running",
        )
        return {j: t for j in names if (t := replaced(j)) is not None}

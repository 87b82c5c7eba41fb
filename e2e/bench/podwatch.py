"""The pods of one namespace as a watch delivers them, stamped with the time each event arrived.

Raw JSON lines, not the client's models: thousands of pods are parsed by the benchmark while the
operator runs on the same cores.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from e2e.psjobs import LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE
from e2e.util import wait_for

Obj = dict[str, Any]


class PodWatch:
    """When each job first had `pods_per_job` pods Running, when a PS of it was first seen Failed,
    when its chief pods of an attempt were first seen being deleted, and when each attempt appeared."""

    def __init__(self, api: client.ApiClient, namespace: str, pods_per_job: int) -> None:
        self.api, self.namespace, self.pods_per_job = api, namespace, pods_per_job
        self.running: dict[str, set[str]] = defaultdict(set)  # job -> names of its Running pods
        self.all_running_at: dict[str, float] = {}
        self.chief_seen_at: dict[tuple[str, str], float] = {}  # (job, attempt) -> first event
        self.chief_deleting_at: dict[tuple[str, str], float] = {}
        self.ps_failed_at: dict[str, float] = {}
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
                self.namespace, label_selector=LABEL_JOB, watch=True, resource_version=since,
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
        labels = meta.get("labels", {})
        job, name = labels.get(LABEL_JOB, ""), meta.get("name", "")
        role, attempt, phase = (
            labels.get(LABEL_ROLE),
            labels.get(LABEL_ATTEMPT, ""),
            pod.get("status", {}).get("phase"),
        )
        if role == "chief":
            self.chief_seen_at.setdefault((job, attempt), now)
            if meta.get("deletionTimestamp"):
                self.chief_deleting_at.setdefault((job, attempt), now)
        if role == "ps" and phase == "Failed":
            self.ps_failed_at.setdefault(job, now)
        running = phase == "Running" and not meta.get("deletionTimestamp")
        if running and kind != "DELETED":
            self.running[job].add(name)
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
        key = str(attempt)
        wait_for(
            lambda: all((j, key) in self.chief_seen_at for j in jobs),
            timeout=timeout,
            interval=0.1,
            message=f"chief pods of attempt {attempt}",
        )
        return {j: self.chief_seen_at[(j, key)] for j in jobs}

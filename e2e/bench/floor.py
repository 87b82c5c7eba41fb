"""The floor: what the operator's requests cost the cluster, made by the benchmark itself with no
operator, the moment it sees what the operator would act on.

- Creating a job: its children as the operator renders them (`create`).
- Recovering from a PS failure (`Recovery`): the operator's requests of a coordinated restart,
  nothing more. The old chief Job is deleted (background propagation), the old chief pod with the
  operator's grace for it, and every other PS pod with a recycled PS's grace. Once those pods are
  gone and a new pod of every PS runs (the operator's new chief waits for that too: a PS's name
  resolves only once it runs, policies/ps_recycle.py), the next attempt's chief Job is created.
  The PS pods are the StatefulSet controller's to replace, as they are for the operator. What is
  left between a PS failure and the new chief pod is KWOK and the controllers: the part of a
  recovery no operator can make shorter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import psjobs
from e2e.bench.podwatch import PodWatch
from psoperator.api.names import child_name
from psoperator.contract import Role
from psoperator.kube import Kube
from psoperator.plan.draft import RECYCLED_PS_GRACE_SECONDS
from psoperator.plan.stages import OLD_CHIEF_GRACE_SECONDS
from psoperator.render import RenderOptions, render_children

Obj = dict[str, Any]
POLL_SECONDS = 0.02  # how often it looks at the watch for failed PS and gone pods
WORKERS = 8  # concurrent clients, as many as create the jobs of a burst


def create(api: client.ApiClient, namespace: str, manifest: Callable[[str], Obj]) -> Callable[[str], None]:
    """The job object (never reconciled: no operator watches the namespace), then its children as
    the operator would create them."""
    kube = Kube(api)

    def create_one(name: str) -> None:
        job = psjobs.create(api, namespace, manifest(name))
        kube.apply_children(namespace, job["metadata"]["uid"], render_children(job), [])

    return create_one


class Recovery:
    """Restarts the chief of every job of `namespace` whose PS `pods` shows Failed, as the operator
    would, until closed. `failed_ps(job)` names the PS that failed."""

    def __init__(
        self, api: client.ApiClient, namespace: str, pods: PodWatch, failed_ps: Callable[[str], str]
    ):
        self.api, self.namespace, self.pods, self.failed_ps = api, namespace, pods, failed_ps
        self.kube = Kube(api)
        self._stopping: dict[str, set[str]] = {}  # job -> uids of the pods its new chief waits for
        self._old_ps: dict[str, dict[str, str]] = {}  # job -> its PS pods at the failure, uid -> name
        self._started: set[str] = set()
        self._pool = ThreadPoolExecutor(WORKERS)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"floor-{namespace}", daemon=True)

    def __enter__(self) -> Recovery:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._thread.join()
        self._pool.shutdown()

    def _run(self) -> None:
        while not self._stopped.wait(POLL_SECONDS):
            for job in set(self.pods.ps_failed_at) - set(self._stopping):
                self._stopping[job] = self._live(job, self.failed_ps(job))
                self._old_ps[job] = self._ps_pods(job)
                self._pool.submit(self._stop_old, job)
            for job, uids in self._stopping.items():
                gone = uids <= self.pods.deleted_at.keys()
                if job not in self._started and gone and self._ps_running_again(job):
                    self._started.add(job)
                    self._pool.submit(self._start_new, job)

    def _live(self, job: str, failed: str) -> set[str]:
        """The uids of `job`'s chief pod and of its PS pods but `failed`, as the watch shows them now."""
        return {
            uid
            for uid, (owner, role, name) in list(self.pods.seen.items())
            if owner == job
            and uid not in self.pods.deleted_at
            and (role == "chief" or (role == "ps" and name != failed))
        }

    def _ps_pods(self, job: str) -> dict[str, str]:
        return {
            uid: name
            for uid, (owner, role, name) in list(self.pods.seen.items())
            if (owner, role) == (job, "ps")
        }

    def _ps_running_again(self, job: str) -> bool:
        """A pod of every PS of `job` runs that is not one of the failure's time."""
        old = self._old_ps[job]
        running = {
            name
            for uid, name in self._ps_pods(job).items()
            if uid not in old and uid in self.pods.running_at and uid not in self.pods.deleted_at
        }
        return set(old.values()) <= running

    def _stop_old(self, job: str) -> None:
        batch, core = client.BatchV1Api(self.api), client.CoreV1Api(self.api)
        _gone_is_fine(
            batch.delete_namespaced_job,
            child_name(job, Role.CHIEF),
            self.namespace,
            propagation_policy="Background",
        )
        for uid in self._stopping[job]:
            _, role, name = self.pods.seen[uid]
            grace = OLD_CHIEF_GRACE_SECONDS if role == "chief" else RECYCLED_PS_GRACE_SECONDS
            body = client.V1DeleteOptions(
                grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=uid)
            )
            _gone_is_fine(core.delete_namespaced_pod, name, self.namespace, body=body)

    def _start_new(self, job: str) -> None:
        owner = psjobs.get(self.api, self.namespace, job)
        assert owner is not None, f"{self.namespace}/{job} is gone"
        name = child_name(job, Role.CHIEF)
        chief = [
            c
            for c in render_children(owner, RenderOptions(attempt=1))
            if (c["kind"], c["metadata"]["name"]) == ("Job", name)
        ]
        for _ in range(500):  # the old Job's name is taken until the API server has removed it
            if not self.kube.apply_children(self.namespace, owner["metadata"]["uid"], chief, []).conflicts:
                return
            time.sleep(POLL_SECONDS)
        raise AssertionError(f"{self.namespace}/{job}: the old chief Job never went")


def _gone_is_fine(delete: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    try:
        delete(*args, **kwargs)
    except ApiException as error:
        if error.status not in (404, 409):
            raise

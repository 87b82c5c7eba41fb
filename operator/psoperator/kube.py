"""The one module that talks to the Kubernetes API (besides kopf's own watching and events).

Children are created with POST and changed with server-side apply only once they are known to be
ours (owner reference to the job's uid), each patch with the uid of the child it was planned for,
so the operator never takes over, makes again or deletes an object it does not own. The fields of
the create are folded into the apply's before the first apply (managed_fields.py). What to change
is decided elsewhere (plan/children.py); this module carries it out.
Blocking client calls run in threads so the kopf event loop stays responsive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from psoperator import API_TIMEOUT_SECONDS, GROUP, PLURAL, VERSION
from psoperator.api.labels import LABEL_JOB
from psoperator.managed_fields import FIELD_MANAGER, folded
from psoperator.observe.views import owned_by
from psoperator.plan.children import MERGE_PATCHED, ChildChange, ChildVerb, plan_children
from psoperator.plan.draft import PodDeletion
from psoperator.render import changeable
from psoperator.render.workload import GROUP as KUEUE_GROUP
from psoperator.render.workload import VERSION as KUEUE_VERSION

Obj = dict[str, Any]
Kept = TypeVar("Kept")
log = logging.getLogger(__name__)

# Blocking API calls at once (threads, and connections to the API server): a PS lost in many jobs
# at once means a fresh read of each before its restart, and they should not queue behind 6 threads.
API_CONCURRENCY = 32

# kind -> (API path prefix, plural)
_PATHS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Job": ("/apis/batch/v1", "jobs"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Workload": (f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}", "workloads"),
    "Secret": ("/api/v1", "secrets"),  # created only (ChildVerb.CREATE_ONLY), never read
}


def load_config() -> None:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = API_CONCURRENCY
    configuration.retries = api_retry()
    client.Configuration.set_default(configuration)


def lease_client(timeout: float, on_response: Callable[[str, str, str, float], None] | None = None) -> Kube:
    """A client for leader election alone (control/leader.py): a connection of its own, so that no
    reconcile's request holds a renew up; no retry within a request (the election tries again at its
    next period); each request bounded by `timeout`."""
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 1
    configuration.retries = False
    return Kube(client.ApiClient(configuration), on_response=on_response, timeout=timeout)


# Error statuses of an API server that is overloaded or restarting: a read that got one is sent again.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRIES, RETRY_BACKOFF_SECONDS = 3, 0.2


class _ApiRetry(urllib3.util.Retry):
    """Which failed requests urllib3 sends again (RETRIES times at most, backing off with jitter,
    after the server's Retry-After when it gives one): a read that got a transient status, and any
    request the server refused with Retry-After (API Priority and Fairness turns a request away
    with 429 before doing anything). Reads that got no answer are sent again too (urllib3's default
    for idempotent requests). A write that failed otherwise fails its reconcile, which its loop
    retries (control/loop.py)."""

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if not self.total:
            return False
        if method.upper() == "GET":
            return status_code in TRANSIENT_STATUSES
        return has_retry_after and status_code == 429


def api_retry() -> urllib3.util.Retry:
    return _ApiRetry(
        total=RETRIES,
        backoff_factor=RETRY_BACKOFF_SECONDS,
        backoff_jitter=RETRY_BACKOFF_SECONDS,  # readers failed together do not retry together
        raise_on_status=False,
    )


def resource_of(path: str) -> str:
    """The resource an API path names, with its subresource: `/api/v1/namespaces/ns/pods/p` is
    "pods", `.../pstrainingjobs/j/status` "pstrainingjobs/status", `/apis/g/v` (discovery) "discovery"."""
    parts = path.split("?")[0].strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # past api/v1 or apis/<group>/<version>
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]  # a namespaced resource; a namespace itself stays "namespaces"
    if not parts:
        return "discovery"
    # <resource>[/<name>[/<subresource>]]
    return f"{parts[0]}/{parts[2]}" if len(parts) > 2 else parts[0]


_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


class StaleJob(Exception):
    """The job changed since it was read: the status computed from it was not written."""


class NotLeading(Exception):
    """A write not sent: this replica no longer holds the leader Lease (control/leader.py), and
    another one may be acting on the same objects."""


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "Kind/name" -> the API server's message
    # The children as the API server answered the creates and patches (and the job's own that a
    # create found there already), `kind` set on each: for the watch cache, which would otherwise
    # lag the operator's own writes by their watch events.
    written: list[Obj] = field(default_factory=list)


def api_failure(error: BaseException) -> str | None:
    """One line for a request the API server failed (an error status, no answer in time, no
    connection) or that was not sent (NotLeading); None for any other error."""
    if isinstance(error, NotLeading):
        return str(error)
    if isinstance(error, ApiException):
        return f"the API server answered {error.status} {error.reason}"
    if isinstance(error, urllib3.exceptions.HTTPError):
        return f"no answer from the API server ({type(error).__name__})"
    return None


# Seconds to connect: the whole timeout (a server that stops answering must not hold a job's
# reconcile loop forever) is the operator's --api-timeout-seconds.
CONNECT_TIMEOUT = 5.0
# Objects a list asks for at a time, so that the full objects of one page at most are held: the pods
# of a fresh read (Kube.list_pods) and kopf's listings before it watches (handlers.configure).
LIST_PAGE = 500
# A child write the API server refuses, named in the job's Warning with the API's message: a bad
# request or an admission webhook's denial (400), a ResourceQuota, Pod Security or RBAC (403), a
# value (422; a Job's immutable fields are never sent, see _patch).
REFUSALS = frozenset({400, 403, 422})
# Times a child's fold (managed_fields.py) is tried, each on a fresh read of it: a fold is refused
# (409) if the child changed since its read (its controller writes its status); after the last,
# the reconcile fails and is tried again.
FOLD_TRIES = 3


class Kube:
    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        on_response: Callable[[str, str, str, float], None] | None = None,
        timeout: float = API_TIMEOUT_SECONDS,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        self.api = api_client or client.ApiClient()
        # Told of every request: its HTTP method, resource (resource_of), status code ("none": no
        # response) and seconds until its answer was read.
        self.on_response = on_response or (lambda _method, _resource, _code, _seconds: None)
        self.timeout = timeout
        # Asked right before each write is sent (with leader election: whether this replica still
        # holds the Lease, control/leader.py). A write it refuses is not sent (NotLeading), so a
        # reconcile's thread that outlived the Lease sends nothing more of its plan.
        self.may_write = may_write or (lambda: True)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> Obj:
        if method != "GET" and not self.may_write():
            raise NotLeading(f"{method} {path} not sent: this replica no longer holds the leader Lease")
        request = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        started = time.monotonic()
        try:
            response = self.api.call_api(
                *request, _request_timeout=(min(CONNECT_TIMEOUT, self.timeout), self.timeout)
            )
        except urllib3.exceptions.HTTPError:
            self.on_response(method, resource_of(path), "none", time.monotonic() - started)
            raise
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        self.on_response(method, resource_of(path), str(response.status), time.monotonic() - started)
        if not 200 <= response.status < 300:
            raise ApiException(
                status=response.status, reason=response.reason, body=data.decode(errors="replace")
            )
        parsed = json.loads(data) if data else {}
        return parsed if isinstance(parsed, dict) else {}

    def _path(self, kind: str, namespace: str, name: str | None = None) -> str:
        prefix, plural = _PATHS[kind]
        base = f"{prefix}/namespaces/{namespace}/{plural}"
        return f"{base}/{name}" if name else base

    # --- the job ---------------------------------------------------------------------------

    def _get(self, path: str) -> Obj | None:
        """The object at `path`; None when there is none (404)."""
        try:
            return self._call("GET", path)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def get_job(self, namespace: str, name: str) -> Obj | None:
        return self._get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")

    def served(self, group: str, version: str) -> set[str]:
        """The resources the API server serves in `group`/`version` (its discovery); none yet: empty."""
        found = self._get(f"/apis/{group}/{version}") or {}
        return {str(r.get("name")) for r in found.get("resources", []) if isinstance(r, dict)}

    def patch_job_status(self, namespace: str, name: str, patch: Obj, resource_version: str) -> Obj:
        """Patch the status computed from the job at `resource_version`; StaleJob (409) if it moved
        since (a write of another replica, a spec change): the caller reads it again."""
        try:
            return self._call(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status",
                {"metadata": {"resourceVersion": resource_version}, "status": patch},
                content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == 409:
                raise StaleJob(f"{namespace}/{name} changed since version {resource_version}") from None
            raise

    def patch_workload_status(self, namespace: str, name: str, patch: Obj, resource_version: str) -> None:
        """Patch a Workload's status computed from its version `resource_version` (a 409 if it moved
        since: Kueue wrote it; the next reconcile decides again from the new one)."""
        path = f"{self._path('Workload', namespace, name)}/status"
        body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
        self._call("PATCH", path, body, content_type="application/merge-patch+json")

    def get_kueue_object(self, plural: str, name: str) -> Obj | None:
        """A cluster-scoped Kueue object (a ResourceFlavor, a WorkloadPriorityClass); None if none."""
        return self._get(f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{plural}/{name}")

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self._delete_at(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}", uid)

    def _delete_at(self, path: str, uid: str, **options: Any) -> None:
        """Delete the object at `path` if it is still the one with `uid`; gone already is fine."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background", **options}
        try:
            self._call("DELETE", path, body)
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    # --- the leader Lease ------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        return self._get(f"{_LEASES.format(namespace=namespace)}/{name}")

    def write_lease(self, lease: Obj) -> bool:
        """Create the Lease, or replace the version it names; False when another replica got there first."""
        meta = lease["metadata"]
        path = _LEASES.format(namespace=meta["namespace"])
        try:
            if meta.get("resourceVersion"):
                self._call("PUT", f"{path}/{meta['name']}", lease)
            else:
                self._call("POST", path, lease)
        except ApiException as error:
            if error.status in (404, 409):  # created, changed or deleted meanwhile
                return False
            raise
        return True

    # --- children --------------------------------------------------------------------------

    def list_children(self, namespace: str, job_name: str, kind: str) -> list[Obj]:
        """The job's children of one kind (CHILD_KINDS), with `kind` set on each."""
        selector = [("labelSelector", f"{LABEL_JOB}={job_name}")]
        listed = self._call("GET", self._path(kind, namespace), query=selector)
        return [{**item, "kind": kind} for item in listed.get("items", [])]

    def list_pods(self, namespace: str, job_name: str, keep: Callable[[Obj], Kept]) -> list[Kept]:
        """The job's pods, read LIST_PAGE at a time (one consistent list through `continue`), each
        passed through `keep` (e.g. observe.parse_pod) before the next page is read: a fresh read of
        a 5,000-task job never holds all its full pods at once."""
        query = [("labelSelector", f"{LABEL_JOB}={job_name}"), ("limit", str(LIST_PAGE))]
        pods: list[Kept] = []
        token = None
        while True:
            page = self._call(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods",
                query=query + ([("continue", token)] if token else []),
            )
            pods += [keep(pod) for pod in page.get("items", [])]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return pods

    def apply_children(
        self,
        namespace: str,
        owner_uid: str,
        desired: list[Obj],
        observed: list[Obj],
        *,
        create_missing: bool = True,
        hold_chief: bool = False,
    ) -> ApplyResult:
        """Plan the children's changes (`plan_children`) and make them (`make_changes`)."""
        changes, conflicts = plan_children(
            owner_uid, desired, observed, create_missing=create_missing, hold_chief=hold_chief
        )
        return self.make_changes(namespace, changes, conflicts)

    def make_changes(self, namespace: str, changes: list[ChildChange], conflicts: list[str]) -> ApplyResult:
        """Create, patch, replace and delete as `plan_children` planned; its `conflicts` (objects of
        the job's children's names that it does not own) come first in the result's. A change the
        API server fails does not hold up the others, but for a NetworkPolicy's create: after it,
        no change that makes pods is made (they would run unisolated). Then the first failure is
        raised. A Secret to create only comes before the chief Job whose pod mounts it: if it
        fails, nothing after it is made (the Job would be created without it for good)."""
        result = ApplyResult(conflicts=list(conflicts))
        failed: Exception | None = None
        unisolated = False
        for change in changes:
            if unisolated and change.makes_pods:
                continue
            try:
                made = self._change(namespace, change, result)
            except (ApiException, urllib3.exceptions.HTTPError) as error:
                if change.verb is ChildVerb.CREATE_ONLY:
                    raise failed or error from None
                failed, made = failed or error, False
            unisolated = unisolated or (change.isolates and not made)
        if failed is not None:
            raise failed
        return result

    def _change(self, namespace: str, change: ChildChange, result: ApplyResult) -> bool:
        """Make one change; False when the API server refused it or an object of another owner has
        the name."""
        kind, name = change.manifest["kind"], change.manifest["metadata"]["name"]
        ref = f"{kind}/{name}"
        if change.verb is ChildVerb.CREATE_ONLY:
            return self._create_only(namespace, change.manifest, result)
        gone = change.replaced if change.verb is not ChildVerb.DELETE else change.manifest
        if gone is not None:
            self._delete_at(self._path(kind, namespace, name), gone["metadata"]["uid"])
            result.deleted.append(ref)
        if change.verb in (ChildVerb.DELETE_REPLACED, ChildVerb.DELETE):
            return True
        try:
            if change.verb is ChildVerb.CREATE:
                path, manager = self._path(kind, namespace), [("fieldManager", FIELD_MANAGER)]
                written = self._call("POST", path, change.manifest, query=manager)
                result.created.append(ref)
            else:
                if change.fold_updates and not self._fold_updates(namespace, change.manifest, result):
                    return False
                written = self._patch(
                    self._path(kind, namespace, name), _for_uid(change.manifest, change.uid)
                )
                result.patched.append(ref)
            result.written.append({**written, "kind": kind})
        except ApiException as error:
            if change.verb is ChildVerb.CREATE and _already_exists(error):
                return self._exists(namespace, change.manifest, result)
            if change.uid is not None and _names_uid(error):  # a stranger's object took the name
                result.conflicts.append(ref)
                return False
            if error.status not in REFUSALS:
                raise
            result.rejected[ref] = _reason(error)
            return False
        return True

    def _create_only(self, namespace: str, manifest: Obj, result: ApplyResult) -> bool:
        """Create an object the operator may not read (a Secret): one of its name already there is
        taken as the job's own, and what the API server answers (the secret) is not kept."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            self._call("POST", self._path(kind, namespace), manifest)
            result.created.append(f"{kind}/{name}")
        except ApiException as error:
            if error.status in REFUSALS:
                result.rejected[f"{kind}/{name}"] = _reason(error)
                return False
            if not _already_exists(error):
                raise
        return True

    def _exists(self, namespace: str, manifest: Obj, result: ApplyResult) -> bool:
        """A create refused as already existing: the job's own child, made by an earlier reconcile
        that the watch has not shown yet (kept as it is: True), or a stranger's of the same name (a
        conflict, left alone). Listed by name: the chart grants list and watch on children, not get."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        own = [item for item in self._named(namespace, manifest) if owned_by(item, _owner(manifest))]
        if own:
            result.written.append({**own[0], "kind": kind})
        else:
            result.conflicts.append(f"{kind}/{name}")
        return bool(own)

    def _named(self, namespace: str, manifest: Obj) -> list[Obj]:
        """The object of the manifest's kind and name, as a list of it or none."""
        query = [("fieldSelector", f"metadata.name={manifest['metadata']['name']}")]
        listed = self._call("GET", self._path(manifest["kind"], namespace), query=query)
        return list(listed.get("items", []))

    def _job_exists(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the Job `name` exists with that uid."""
        named = self._named(namespace, {"kind": "Job", "metadata": {"name": name}})
        return any(job.get("metadata", {}).get("uid") == uid for job in named)

    def _fold_updates(self, namespace: str, manifest: Obj, result: ApplyResult) -> bool:
        """Fold the operator's Update entries of the child into its Apply entry (managed_fields.py),
        on the child read now, guarded by the version read. False: the child is gone (the next
        reconcile creates it) or a stranger's (a conflict, left alone), and is not to be applied."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        tries = 0
        while True:
            live = next(iter(self._named(namespace, manifest)), None)
            if live is None:
                return False
            if not owned_by(live, _owner(manifest)):
                result.conflicts.append(f"{kind}/{name}")
                return False
            meta = live["metadata"]
            fields = folded(meta.get("managedFields") or [], manifest["apiVersion"])
            if fields is None:
                return True
            body = {"metadata": {"resourceVersion": meta["resourceVersion"], "managedFields": fields}}
            try:
                path, manager = self._path(kind, namespace, name), [("fieldManager", FIELD_MANAGER)]
                self._call("PATCH", path, body, content_type="application/merge-patch+json", query=manager)
                return True
            except ApiException as error:
                tries += 1
                if error.status != 409 or tries == FOLD_TRIES:
                    raise

    def _patch(self, path: str, manifest: Obj) -> Obj:
        if manifest["kind"] in MERGE_PATCHED:
            # Only the fields a Job (or a Workload) lets change, as a merge patch: an apply of the
            # partial object would remove the immutable fields it leaves out, and one of the whole
            # is refused.
            # A dict: the client JSON-encodes bodies of JSON content types (a str would be sent as
            # a JSON string, which the API server refuses).
            return self._call(
                "PATCH",
                path,
                changeable(manifest),
                content_type="application/merge-patch+json",
                query=[("fieldManager", FIELD_MANAGER)],
            )
        return self._call(
            "PATCH",
            path,
            json.dumps(manifest),
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        """Delete a pod the plan named, only if it is still the pod it saw (uid precondition) and,
        for an orphan, only if its Job is gone (read now, after the pod was seen)."""
        if deletion.orphan_of is not None and self._job_exists(namespace, *deletion.orphan_of):
            return
        path = f"/api/v1/namespaces/{namespace}/pods/{deletion.pod}"
        grace = deletion.grace_seconds
        self._delete_at(path, deletion.uid, **({} if grace is None else {"gracePeriodSeconds": grace}))


def _for_uid(manifest: Obj, uid: str | None) -> Obj:
    """The manifest with `uid` in its metadata: a precondition of its patch (the object of that
    name has another uid: 422, metadata.uid is immutable; none has the name: 409, none is made)."""
    return manifest if uid is None else {**manifest, "metadata": {**manifest["metadata"], "uid": uid}}


def _owner(manifest: Obj) -> str:
    uid: str = manifest["metadata"]["ownerReferences"][0]["uid"]
    return uid


def _already_exists(error: ApiException) -> bool:
    """A create refused because an object has the name (409 AlreadyExists). Another 409 (Conflict:
    a write that raced another) says nothing of the name: the reconcile tries again."""
    try:
        return error.status == 409 and bool(json.loads(error.body or "{}").get("reason") == "AlreadyExists")
    except ValueError:
        return False


def _names_uid(error: ApiException) -> bool:
    """A patch refused for its uid precondition: the object of the name has another uid (422)."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return False
    details = body.get("details") if isinstance(body, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return (
        error.status == 422
        and isinstance(causes, list)
        and any(isinstance(cause, dict) and cause.get("field") == "metadata.uid" for cause in causes)
    )


def _reason(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message", error.reason))
    except ValueError:
        return str(error.reason)


async def in_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(function, *args, **kwargs)

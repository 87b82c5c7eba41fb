"""Failure injection for pods and nodes of the local KWOK cluster.

Each helper produces, through the API, exactly the state a kubelet or a control-plane component
would write for that failure, so the operator cannot tell it from the real thing:

- `fail_container`, `oom_kill`, `complete_pod`: annotate the pod; the `psoperator-pod-container-exit`
  KWOK stage (e2e/cluster/kwok-stages.yaml) terminates every container with the chosen exit code,
  reason and message, and sets the phase to Failed (Succeeded for 0). No later stage matches a
  terminal pod, so it stays that way.
- `restart_container`: patches the pod's status subresource as a kubelet does after a crash and
  restart in place: restartCount + 1, lastState.terminated, state.running again. The pod stays
  Running and Ready, which no stage reacts to.
- `make_node_not_ready`, `make_node_unreachable` / `make_node_ready`: label the node; the
  `psoperator-node-not-ready` stage posts Ready=False, `psoperator-node-unreachable` Ready=Unknown,
  and the node stages leave a labelled node alone until the label goes.
- `fence_node` / `unfence_node`: the out-of-service taint an admin sets on a node known to be down.
- `evict_pod`: the real Eviction API (the API server adds DisruptionTarget, honours PDBs).
- `preempt_pod`: what kube-scheduler does to a victim: DisruptionTarget/PreemptionByScheduler on the
  status, then a graceful delete.
- `pod_deletion_refused`: nobody but the users named (the operator) may delete some pods: the
  garbage collector cannot delete those of a deleted owner, as when it lags behind (it re-lists
  after an API server restart).

Deleted pods are terminated by the stages like a kubelet would (exit 143, phase Failed) and then
removed. Every helper waits until the injected state is visible and returns what it observed.
Pod and node failures other than eviction and preemption need KWOK's simulated nodes: against a
real kubelet (kind) the kubelet would overwrite the injected status.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from e2e.util import WaitTimeout, as_json, condition, get_node, get_pod, get_pod_or_none, wait_for

ANNOTATION_EXIT_CODE = "psoperator.io/chaos-exit-code"
ANNOTATION_REASON = "psoperator.io/chaos-reason"
ANNOTATION_MESSAGE = "psoperator.io/chaos-message"
ANNOTATION_DRAIN = "psoperator.io/chaos-drain"
LABEL_NODE_NOT_READY = "psoperator.io/chaos-not-ready"
TAINT_OUT_OF_SERVICE = {
    "key": "node.kubernetes.io/out-of-service",
    "value": "nodeshutdown",
    "effect": "NoExecute",
}

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
DEFAULT_TIMEOUT = 30.0

Json = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(api: client.ApiClient, namespace: str, name: str) -> str:
    pod = get_pod_or_none(api, namespace, name)
    if pod is None:
        return f"pod {namespace}/{name} is gone"
    status = pod.get("status", {})
    return (
        f"pod {namespace}/{name} phase={status.get('phase')} node={pod['spec'].get('nodeName')} "
        f"containers={status.get('containerStatuses')}"
    )


def fail_container(
    api: client.ApiClient,
    namespace: str,
    name: str,
    exit_code: int = 1,
    reason: str | None = None,
    message: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Json:
    """Terminates the pod's containers with `exit_code` (and `reason`, `message` if given).

    The pod ends Failed, or Succeeded for exit code 0, as a kubelet reports a pod whose
    restartPolicy does not restart it; the default reason is Error (Completed for 0). A pod that
    is not Running yet fails as soon as it runs. Returns the terminated pod as JSON.
    """
    patched = annotate_exit(api, namespace, name, exit_code, reason=reason, message=message)
    terminal = "Succeeded" if exit_code == 0 else "Failed"
    return _await_pod_version(
        api,
        patched,
        lambda pod: pod.get("status", {}).get("phase") == terminal,
        timeout,
        f"{terminal} after exit code {exit_code}",
    )


def annotate_exit(
    api: client.ApiClient,
    namespace: str,
    name: str,
    exit_code: int,
    reason: str | None = None,
    message: str | None = None,
    uid: str | None = None,
) -> Json:
    """Asks the simulated kubelet to terminate the pod's containers (see `fail_container`) and
    returns the annotated pod at once, without waiting for the termination.

    With `uid`, only that pod: the API server refuses the patch (422, metadata.uid is immutable)
    once the name belongs to a replacement, so a retried injection never fails a second pod.
    """
    metadata: Json = {"annotations": {ANNOTATION_EXIT_CODE: str(int(exit_code))}}
    if reason is not None:
        metadata["annotations"][ANNOTATION_REASON] = reason
    if message is not None:
        metadata["annotations"][ANNOTATION_MESSAGE] = message
    if uid is not None:
        metadata["uid"] = uid
    patched = client.CoreV1Api(api).patch_namespaced_pod(
        name, namespace, {"metadata": metadata}, _content_type=MERGE_PATCH
    )
    return as_json(api, patched)


def _await_pod_version(
    api: client.ApiClient, start: Json, reached: Callable[[Json], bool], timeout: float, what: str
) -> Json:
    """The first version of the pod `start` (same uid, at or after its resourceVersion) for which
    `reached` holds. Watched rather than polled: a controller may delete a failed pod and create
    its replacement under the same name within milliseconds (StatefulSets do).
    """
    meta = start["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    if reached(start):
        return start
    since = meta["resourceVersion"]
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=since,
            timeout_seconds=max(1, int(remaining)),
        ):
            pod: Json = event["raw_object"]
            if pod.get("kind") == "Status":  # e.g. 410 Gone: the version is too old to watch from
                raise RuntimeError(f"watching pod {namespace}/{name} failed: {pod.get('message')}")
            since = pod["metadata"]["resourceVersion"]
            if pod["metadata"]["uid"] != uid:
                continue
            if reached(pod):
                stream.stop()  # type: ignore[no-untyped-call]
                return pod
            if event["type"] == "DELETED":
                raise AssertionError(f"pod {namespace}/{name} was deleted before {what}: {pod.get('status')}")
    raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {what}: {_describe(api, namespace, name)}")


def oom_kill(api: client.ApiClient, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> Json:
    """The pod's containers are killed for exceeding their memory limit (137, OOMKilled)."""
    return fail_container(api, namespace, name, exit_code=137, reason="OOMKilled", timeout=timeout)


def complete_pod(api: client.ApiClient, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> Json:
    """The pod's containers exit 0 and the pod Succeeds."""
    return fail_container(api, namespace, name, exit_code=0, timeout=timeout)


def restart_container(
    api: client.ApiClient,
    namespace: str,
    name: str,
    container: str | None = None,
    exit_code: int = 1,
    reason: str = "Error",
    timeout: float = DEFAULT_TIMEOUT,
) -> Json:
    """The container (default: the first) crashes with `exit_code` and is restarted in place.

    Returns the pod as patched: restartCount is one more, lastState.terminated holds the crash and
    the container is running again, as after a kubelet restart under restartPolicy Always/OnFailure.
    """
    core = client.CoreV1Api(api)

    def running_pod() -> Json | None:
        pod = get_pod(api, namespace, name)
        status = pod.get("status", {})
        return pod if status.get("phase") == "Running" and status.get("containerStatuses") else None

    def patch_once() -> Json | None:
        pod = wait_for(running_pod, timeout=timeout, message=lambda: _describe(api, namespace, name))
        statuses: list[Json] = pod["status"]["containerStatuses"]
        target = container or statuses[0]["name"]
        matching = [s for s in statuses if s["name"] == target]
        if not matching:
            raise ValueError(f"pod {namespace}/{name} has no container {target!r}")
        status = matching[0]
        now = _now()
        started = status.get("state", {}).get("running", {}).get("startedAt", now)
        status["lastState"] = {
            "terminated": {
                "exitCode": int(exit_code),
                "reason": reason,
                "startedAt": started,
                "finishedAt": now,
                "containerID": status.get("containerID", ""),
            }
        }
        status["state"] = {"running": {"startedAt": now}}
        status["restartCount"] = int(status.get("restartCount", 0)) + 1
        status["ready"] = True
        status["started"] = True
        body = {
            # The resourceVersion makes the write conditional: a concurrent change means retry.
            "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
            "status": {"containerStatuses": statuses},
        }
        try:
            patched = core.patch_namespaced_pod_status(name, namespace, body, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return as_json(api, patched)

    return wait_for(
        patch_once, timeout=timeout, message=lambda: f"restart of {_describe(api, namespace, name)}"
    )


def node_ready_status(api: client.ApiClient, node: str) -> str | None:
    """The status ("True", "False", "Unknown") of the node's Ready condition."""
    cond = condition(get_node(api, node).get("status"), "Ready")
    return str(cond["status"]) if cond else None


def _label_node(api: client.ApiClient, node: str, value: str | None) -> None:
    body = {"metadata": {"labels": {LABEL_NODE_NOT_READY: value}}}
    client.CoreV1Api(api).patch_node(node, body, _content_type=MERGE_PATCH)


def make_node_not_ready(api: client.ApiClient, node: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """The node's kubelet reports Ready=False (reason KubeletNotReady) until `make_node_ready`."""
    _label_node(api, node, "true")
    wait_for(
        lambda: node_ready_status(api, node) == "False",
        timeout=timeout,
        message=lambda: f"node {node} Ready=False (now {node_ready_status(api, node)})",
    )


def make_node_ready(api: client.ApiClient, node: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Undoes `make_node_not_ready` and `make_node_unreachable`: the node reports Ready=True again."""
    _label_node(api, node, None)
    wait_for(
        lambda: node_ready_status(api, node) == "True",
        timeout=timeout,
        message=lambda: f"node {node} Ready=True (now {node_ready_status(api, node)})",
    )


def make_node_unreachable(api: client.ApiClient, node: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """The node stops reporting, as a crashed kubelet or a network partition leaves it: Ready=Unknown
    (every condition Unknown, as the node lifecycle controller posts it) until `make_node_ready`. Its
    pods still show Running. KWOK still plays them (a deletion there completes), which a real
    unreachable node's would not."""
    _label_node(api, node, "unreachable")
    wait_for(
        lambda: node_ready_status(api, node) == "Unknown",
        timeout=timeout,
        message=lambda: f"node {node} Ready=Unknown (now {node_ready_status(api, node)})",
    )


def _set_taint(api: client.ApiClient, node: str, taint: Json, present: bool) -> None:
    """Adds or removes one taint, keeping the others (the node lifecycle controller's among them)."""

    def write() -> bool:
        found = get_node(api, node)
        others = [t for t in found["spec"].get("taints") or [] if t["key"] != taint["key"]]
        body = {
            "metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
            "spec": {"taints": others + ([taint] if present else [])},
        }
        try:
            client.CoreV1Api(api).patch_node(node, body, _content_type=MERGE_PATCH)
        except ApiException as error:
            if error.status == 409:  # the lifecycle controller wrote it meanwhile: read it again
                return False
            raise
        return True

    wait_for(write, timeout=DEFAULT_TIMEOUT, message=f"taint {taint['key']} of node {node}")


def fence_node(api: client.ApiClient, node: str) -> None:
    """What an admin does once a lost node is known to be shut down (non-graceful node shutdown):
    the out-of-service taint."""
    _set_taint(api, node, TAINT_OUT_OF_SERVICE, present=True)


def unfence_node(api: client.ApiClient, node: str) -> None:
    _set_taint(api, node, TAINT_OUT_OF_SERVICE, present=False)


def evict_pod(api: client.ApiClient, namespace: str, name: str, drain_seconds: float = 0) -> None:
    """Evicts the pod through the Eviction API, as `kubectl drain` or the descheduler do.

    The API server adds DisruptionTarget (reason EvictionByEvictionAPI) and deletes the pod
    gracefully; the simulated kubelet keeps it running `drain_seconds` (a PS serving on after its
    SIGTERM), then fails and removes it. Raises ApiException 429 when a PodDisruptionBudget
    forbids the eviction, like the real API.
    """
    if drain_seconds:
        drain = {"metadata": {"annotations": {ANNOTATION_DRAIN: f"{drain_seconds}s"}}}
        client.CoreV1Api(api).patch_namespaced_pod(name, namespace, drain, _content_type=MERGE_PATCH)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    client.CoreV1Api(api).create_namespaced_pod_eviction(name, namespace, eviction)


def mark_disruption(
    api: client.ApiClient, namespace: str, name: str, preemptor: str = "e2e/high-priority"
) -> None:
    """What kube-scheduler does to a victim first: DisruptionTarget (PreemptionByScheduler) in its status."""
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": f"default-scheduler: preempting to accommodate a higher priority pod {preemptor}",
        "lastTransitionTime": _now(),
    }
    client.CoreV1Api(api).patch_namespaced_pod_status(
        name, namespace, {"status": {"conditions": [disruption]}}, _content_type=STRATEGIC_MERGE_PATCH
    )


def preempt_pod(
    api: client.ApiClient, namespace: str, name: str, preemptor: str = "e2e/high-priority"
) -> None:
    """Preempts the pod the way kube-scheduler does for a higher-priority pod: DisruptionTarget in
    its status, then a graceful deletion."""
    mark_disruption(api, namespace, name, preemptor)
    client.CoreV1Api(api).delete_namespaced_pod(name, namespace)


@contextlib.contextmanager
def pod_deletion_refused(
    api: client.ApiClient, namespace: str, labels: dict[str, str], probe: str, allowed: str | None = None
) -> Iterator[Callable[[str], None]]:
    """While inside, only a user whose name starts with `allowed` (None: nobody) may start the
    deletion of a pod of `namespace` carrying `labels`. The garbage collector's is refused (it tries
    again with back-off): the pods of a deleted owner stay and run, not being deleted, as when it
    lags behind. A pod being deleted already may still be removed (KWOK ends it as a kubelet would).
    Entered once a dry-run deletion of the pod `probe` is refused: the API server enforces it.
    Yields a function that lets the users whose names start with its argument start deletions."""
    name = f"psoperator-e2e-deletion-refused-{namespace}"
    admission = client.AdmissionregistrationV1Api(api)
    policy = client.V1ValidatingAdmissionPolicy.from_dict(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["DELETE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": _deletions_allowed(allowed),
            },
        }
    )
    binding = client.V1ValidatingAdmissionPolicyBinding.from_dict(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "objectSelector": {"matchLabels": labels},
                },
            },
        }
    )
    assert policy is not None and binding is not None

    def allow(users: str) -> None:
        patch = {"spec": {"validations": _deletions_allowed(users)}}
        admission.patch_validating_admission_policy(name, patch)

    admission.create_validating_admission_policy(policy)
    try:
        admission.create_validating_admission_policy_binding(binding)
        try:
            wait_for(
                lambda: _deletion_refused(api, namespace, probe),
                timeout=DEFAULT_TIMEOUT,
                message=f"the API server refusing the deletion of {probe}",
            )
            yield allow
        finally:
            admission.delete_validating_admission_policy_binding(name)
    finally:
        admission.delete_validating_admission_policy(name)


def _deletions_allowed(users: str | None) -> list[Json]:
    """The policy's validation: a deletion under way, or one started by `users`."""
    started_by = "" if users is None else f" || request.userInfo.username.startsWith('{users}')"
    expression = f"has(oldObject.metadata.deletionTimestamp){started_by}"
    return [{"expression": expression, "message": "refused by an e2e test (chaos.pod_deletion_refused)"}]


def _deletion_refused(api: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, dry_run="All")
    except ApiException as error:
        if error.status in (403, 422):
            return True
        raise
    return False

"""The PSTrainingJob API (psoperator.io/v1alpha1) as typed models.

These models are the one source of the CRD's schema (see crd.py) and what the operator parses a
job's spec into. Field descriptions become the CRD's, so `kubectl explain` shows them. Pod
templates and volumes stay plain dicts here: the CRD validates them with the upstream Kubernetes
schema, and the renderers pass them through.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.config import JsonDict

from psoperator.api.vocabulary import Phase
from psoperator.contract import DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS, DEFAULT_PERMANENT_EXIT_CODES, Role
from psoperator.fields import INT_LIMIT, int_of

# Markers read by the CRD generator: these fields get the upstream Kubernetes schema.
POD_TEMPLATE: JsonDict = {"x-psoperator-upstream": "io.k8s.api.core.v1.PodTemplateSpec"}
VOLUME_SOURCE: JsonDict = {"x-psoperator-upstream": "io.k8s.api.core.v1.Volume"}

MAX_REPLICAS = 1000  # parameter servers
# Workers: a 5,000-task job runs on the local control plane (python -m e2e.bench --full). The
# cluster goes to the pods through a ConfigMap of at most 1 MiB past this size (render/tfconfig.py).
MAX_WORKERS = 10_000


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ChiefSpec(_Model):
    replicas: int = Field(
        1,
        ge=1,
        le=1,
        description="Always 1: TensorFlow's ParameterServerStrategy has exactly one chief (the coordinator).",
    )
    template: dict[str, Any] = Field(
        default_factory=dict,
        description="Pod template of the chief. Its completion is the job's success.",
        json_schema_extra=POD_TEMPLATE,
    )


class ReplicatedRoleSpec(_Model):
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Number of parameter servers (1 to 1000).")
    template: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Pod template of every task of this role. Request GPUs through "
            'resources.limits["nvidia.com/gpu"].'
        ),
        json_schema_extra=POD_TEMPLATE,
    )


class WorkerSpec(ReplicatedRoleSpec):
    replicas: int = Field(1, ge=1, le=MAX_WORKERS, description="Number of workers (1 to 10000).")


class EvaluatorSpec(_Model):
    template: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Pod template of the evaluator, which follows the checkpoints. It is not part of the "
            "TensorFlow cluster spec."
        ),
        json_schema_extra=POD_TEMPLATE,
    )


# What the API server requires of a Secret's key (an env var's secretKeyRef.key): checked here, so a
# bad key is refused with the job instead of failing every pod template's create.
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"


class SecretKeys(_Model):
    name: str = Field(..., min_length=1, max_length=253, description="A Secret in the job's namespace.")
    access_key_id_key: str = Field(
        "AWS_ACCESS_KEY_ID",
        alias="accessKeyIdKey",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY,
        description="Its key holding the access key ID (letters, digits, '-', '_', '.').",
    )
    secret_access_key_key: str = Field(
        "AWS_SECRET_ACCESS_KEY",
        alias="secretAccessKeyKey",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY,
        description="Its key holding the secret access key (letters, digits, '-', '_', '.').",
    )


class S3Storage(_Model):
    endpoint: str | None = Field(
        None,
        max_length=1024,
        description="The store's URL (http(s)://host[:port]) for an S3-compatible store; AWS S3 when unset.",
    )
    region: str | None = Field(
        None, max_length=64, description="The region requests are signed for (us-east-1 when unset)."
    )
    addressing_style: Literal["path", "virtual"] | None = Field(
        None,
        alias="addressingStyle",
        description=(
            "path (endpoint/bucket/key) or virtual (bucket.endpoint/key); unset: virtual for AWS, "
            "path for an endpoint."
        ),
    )
    credentials_secret: SecretKeys | None = Field(
        None,
        alias="credentialsSecret",
        description=(
            "The Secret holding the access key, given to the roles that touch the bucket (chief, "
            "parameter servers, evaluator, and workers with shareWithWorkers) as environment "
            "variables. Unset: the pods' own identity (workload identity on their ServiceAccount)."
        ),
    )
    share_with_workers: bool = Field(
        False,
        alias="shareWithWorkers",
        description=(
            "Give the workers the store's settings and credentials too, for training data they read from it."
        ),
    )


class CheckpointSpec(_Model):
    dir: str = Field(
        ...,
        min_length=1,
        max_length=1024,
        description=(
            "Where checkpoints are written and restored from: an absolute path inside the pods "
            "(shared by chief and parameter servers, which write their own shards) or a gs:// or "
            "s3:// URI."
        ),
    )
    volume: dict[str, Any] | None = Field(
        None,
        description=(
            "A volume source (for example persistentVolumeClaim) mounted at dir in the chief, "
            "parameter servers, workers and evaluator. Only for a path dir."
        ),
        json_schema_extra=VOLUME_SOURCE,
    )
    s3: S3Storage | None = Field(None, description="How the pods reach the store of an s3:// dir.")
    interval_steps: int | None = Field(
        None, alias="intervalSteps", ge=1, description="Checkpoint every this many global steps."
    )
    interval_seconds: int | None = Field(
        None, alias="intervalSeconds", ge=1, description="Checkpoint at least this often, in seconds."
    )


class FailurePolicy(_Model):
    max_restarts: int = Field(
        5,
        alias="maxRestarts",
        ge=0,
        le=10000,
        description=(
            "How many coordinated restarts (parameter server or chief lost) the job may make before "
            "it fails. A restart after which a newer checkpoint was written does not count."
        ),
    )
    permanent_exit_codes: list[int] = Field(
        default_factory=lambda: list(DEFAULT_PERMANENT_EXIT_CODES),
        alias="permanentExitCodes",
        max_length=255,
        description=(
            "Chief exit codes that fail the job at once instead of restarting it (1 to 255); a "
            "worker's too, per workerPermanentExit. The trainer runtime exits 1 for a bug in user "
            "code and 2 for bad configuration. A change reaches the chief's Job, whose pod failure "
            "policy is immutable, at the next chief attempt."
        ),
    )
    worker_permanent_exit: Literal["FailJob", "Record"] = Field(
        "FailJob",
        alias="workerPermanentExit",
        description=(
            "What a worker that exits with a code in permanentExitCodes does to the job: FailJob "
            "(a bug in user code comes back at every restart) or Record (only record it; the "
            "StatefulSet restarts the worker). A parameter server lost in the same reconcile "
            "explains the exit and wins."
        ),
    )
    stall_timeout_seconds: int | None = Field(
        None,
        alias="stallTimeoutSeconds",
        ge=1,
        description=(
            "Set the Stalled condition when the global step has not advanced for this long while "
            "every pod runs. Off when unset."
        ),
    )
    scheduling_timeout_seconds: int | None = Field(
        None,
        alias="schedulingTimeoutSeconds",
        ge=1,
        description=(
            "Fail the job (reason Unschedulable) when the chief or a parameter server has not been "
            "scheduled for this long (PodScheduled=False). A worker or evaluator that cannot be "
            "scheduled is only reported, in the Unschedulable condition. Off when unset: pods wait "
            "for room."
        ),
    )
    connect_timeout_seconds: int = Field(
        600,
        alias="connectTimeoutSeconds",
        ge=1,
        description="How long the chief waits for its peers before it exits to be restarted.",
    )
    node_lost_timeout_seconds: int = Field(
        120,
        alias="nodeLostTimeoutSeconds",
        ge=0,
        description=(
            "How long a pod's node may be NotReady or unreachable (its Ready condition not True, "
            "counted from the condition's last transition) before the job reports the pod in its "
            "NodeLost condition. A node that stopped reporting may still run the pod, so it is "
            "replaced only once its node is known to be down: tainted "
            "node.kubernetes.io/out-of-service (non-graceful node shutdown) or deleted. The "
            "operator then force-deletes it at once, so that its StatefulSet or a new chief "
            "attempt replaces it; recorded as NodeLost, a disruption that is not counted against "
            "maxRestarts."
        ),
    )
    checkpoint_before_stop_seconds: int = Field(
        DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS,
        alias="checkpointBeforeStopSeconds",
        ge=0,
        le=3600,
        description=(
            "Before a stop the cluster plans (runPolicy.suspend, a parameter server evicted, "
            "drained or preempted), ask the chief for a checkpoint (POST /checkpoint on its "
            "progress port) and wait for it up to this long, so that the stop loses no step; the "
            "chief then schedules no step for as long. 0: never ask. A chief that does not serve "
            "the request (a plain TensorFlow image) is not waited for."
        ),
    )
    startup_error_grace_seconds: int = Field(
        300,
        alias="startupErrorGraceSeconds",
        ge=0,
        description=(
            "How long the chief or a parameter server may be unable to start (an image pull or "
            "container config error) before the job fails, counted from when the operator first saw "
            "the container's current waiting state, not from the pod's creation. A worker that "
            "cannot start for this long is recorded; training goes on without it."
        ),
    )


class RunPolicy(_Model):
    suspend: bool = Field(
        False,
        description=(
            "Delete the job's pods and keep everything else; set back to false to resume from the "
            "latest checkpoint."
        ),
    )
    active_deadline_seconds: int | None = Field(
        None,
        alias="activeDeadlineSeconds",
        ge=1,
        description=(
            "Fail the job when it has been running for longer than this; its pods stop per "
            "cleanPodPolicy, the running chief's included (its Job is suspended)."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        alias="ttlSecondsAfterFinished",
        ge=0,
        description="Delete the job this many seconds after it succeeded or failed.",
    )
    clean_pod_policy: Literal["All", "Running", "None"] = Field(
        "All",
        alias="cleanPodPolicy",
        description=(
            "Which pods to delete when the job finishes: All, Running (only those still running) or None."
        ),
    )


# What the API server requires of a pod's schedulerName and priorityClassName: a DNS-1123 subdomain.
# Checked here, so a bad name is refused with the job instead of failing every pod's creation.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SchedulingSpec(_Model):
    scheduler_name: str | None = Field(
        None,
        alias="schedulerName",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="Scheduler of every pod, e.g. volcano (a DNS subdomain).",
    )
    priority_class_name: str | None = Field(
        None,
        alias="priorityClassName",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PriorityClass of every pod (a DNS subdomain).",
    )


class NetworkPolicySpec(_Model):
    enabled: bool = Field(
        True,
        description=(
            "Isolate the job's pods with NetworkPolicies (TensorFlow's gRPC has no authentication): "
            "the gRPC port takes connections only from the job's own pods, the chief's progress port "
            "only from the operator's namespace, and nothing else gets in; your own NetworkPolicies "
            "add to these. Needs a network plugin that enforces NetworkPolicy. Set false to remove them."
        ),
    )


class EmbeddingTable(_Model):
    name: str = Field(..., min_length=1, max_length=253, description="Name of the table.")
    rows: int = Field(..., ge=1, description="Vocabulary size (rows).")
    dim: int = Field(..., ge=1, description="Embedding dimension (columns).")


class ModelHints(_Model):
    parameters: int | None = Field(
        None, ge=1, description="Total number of trainable parameters held by the parameter servers."
    )
    embeddings: list[EmbeddingTable] = Field(
        default_factory=list,
        max_length=256,
        description="Embedding tables, partitioned across the parameter servers.",
    )
    bytes_per_parameter: int = Field(
        4, alias="bytesPerParameter", ge=1, le=8, description="4 for float32, 2 for bfloat16/float16."
    )
    optimizer: Literal["sgd", "momentum", "adagrad", "adam", "adamw", "ftrl"] = Field(
        "adam", description="Optimizer; decides how many slot copies of each parameter the PS hold."
    )
    max_shard_bytes: int | None = Field(
        None, alias="maxShardBytes", ge=1, description="Largest shard of a partitioned variable."
    )
    enforce: bool = Field(
        False,
        description=(
            "Refuse to start when the parameter servers' memory cannot hold their share, instead "
            "of a warning."
        ),
    )


class PSTrainingJobSpec(_Model):
    image: str | None = Field(
        None, min_length=1, description="Image of every container whose template names none."
    )
    port: int = Field(2222, ge=1, le=65535, description="gRPC port of every TensorFlow task.")
    chief: ChiefSpec = Field(..., description="The chief, which runs the coordinator.")
    ps: ReplicatedRoleSpec = Field(..., description="The parameter servers, which hold the variables.")
    worker: WorkerSpec = Field(..., description="The workers, which compute the gradients.")
    evaluator: EvaluatorSpec | None = Field(None, description="An optional evaluator.")
    checkpoint: CheckpointSpec = Field(..., description="Checkpoint storage, shared by all roles.")
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy, alias="failurePolicy", description="How failures are handled."
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy, alias="runPolicy", description="Suspension, deadlines, clean-up."
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec, description="Scheduling settings applied to every pod."
    )
    model: ModelHints | None = Field(
        None, description="Model size hints, used to check that the parameter servers fit it."
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        alias="networkPolicy",
        description="Ingress isolation of the job's pods (on by default).",
    )


# --- status -------------------------------------------------------------------------------------


class _Status(BaseModel):
    # Status is read back from the cluster: tolerate fields this version does not know.
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Condition(_Status):
    type: str = Field(..., description="Created, Running, Restarting, Succeeded, Failed, Suspended, ...")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(..., description="CamelCase reason for the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field(
        ..., alias="lastTransitionTime", description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="The spec generation the condition was computed from."
    )


class ReplicaStatus(_Status):
    desired: int = Field(0, description="Tasks of this role the spec asks for.")
    ready: int = Field(0, description="Pods of this role that are Ready.")
    running: int = Field(0, description="Pods of this role that are Running.")
    succeeded: int = Field(0, description="Pods of this role that succeeded.")
    failed: int = Field(0, description="Pods of this role that failed.")
    restarts: int = Field(0, description="Container restarts and pod replacements observed.")


class FailureRecord(_Status):
    role: str = Field(..., description="Role of the failed task: chief, ps, worker or evaluator.")
    index: int | None = Field(None, description="Task index within its role.")
    pod: str | None = Field(None, description="Name of the failed pod.")
    exit_code: int | None = Field(None, alias="exitCode", description="Exit code of the failed container.")
    reason: str = Field(..., description="OOMKilled, Error, Evicted, Preempted, NodeLost, ...")
    message: str = Field("", description="Human-readable details.")
    time: str = Field(
        ...,
        description=(
            "When the failure happened: the container's termination, the pod's disruption or the "
            "request to delete it; when the API does not say, when the operator saw it (RFC 3339)."
        ),
    )
    summary: str | None = Field(
        None, description="The task and the reason, e.g. ps-1 OOMKilled (kubectl get)."
    )


class CheckpointStatus(_Status):
    step: int = Field(..., description="Global step of the latest checkpoint.")
    path: str | None = Field(None, description="Path or URI of the latest checkpoint.")
    time: str | None = Field(None, description="When it was written (RFC 3339).")


class PlannedStop(_Status):
    """A stop the cluster planned, and the checkpoint the chief wrote for it when asked."""

    cause: str = Field(
        ...,
        description=(
            "Suspend, Drain (a parameter server evicted, drained or preempted), Resize, or Evicted "
            "(Kueue took the job's admission back: preemption, deactivation)."
        ),
    )
    pods: list[str] = Field(default_factory=list, description="The pods whose stop it was.")
    uids: list[str] = Field(default_factory=list, description="Their uids: a stop is asked for once.")
    time: str = Field(..., description="When the chief answered, or the asking gave up (RFC 3339).")
    checkpoint_step: int | None = Field(
        None, alias="checkpointStep", description="The step of the checkpoint the stop was taken after."
    )
    checkpoint_path: str | None = Field(None, alias="checkpointPath", description="Its path or URI.")
    saved: bool | None = Field(
        None, description="Written for this stop (false: the latest checkpoint already was at the step)."
    )
    reason: str | None = Field(None, description="Why there was no checkpoint, when there was none.")


class Toleration(_Status):
    """A toleration a ResourceFlavor gives the pods it places (as core/v1 spells it)."""

    key: str | None = Field(None, description="The taint key.")
    operator: str | None = Field(None, description="Exists or Equal.")
    value: str | None = Field(None, description="The taint value.")
    effect: str | None = Field(None, description="NoSchedule, PreferNoSchedule or NoExecute.")
    toleration_seconds: int | None = Field(None, alias="tolerationSeconds", description="For NoExecute.")


class PodSetAdmission(_Status):
    """What Kueue's admission puts on one role's pods (its pod set in the Workload)."""

    name: str = Field(..., description="The pod set: chief, ps, worker or evaluator.")
    flavors: dict[str, str] = Field(default_factory=dict, description="Resource name -> ResourceFlavor.")
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        alias="nodeSelector",
        description="The flavors' nodeLabels, and admission checks'.",
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="The flavors' tolerations.")
    labels: dict[str, str] = Field(default_factory=dict, description="From admission checks' podSetUpdates.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="From admission checks' podSetUpdates."
    )


class Admission(_Status):
    """The Workload that Kueue admitted, and what it puts on the job's pods."""

    workload: str = Field(..., description="The Workload's name.")
    cluster_queue: str = Field(..., alias="clusterQueue", description="The ClusterQueue that admitted it.")
    pod_sets: list[PodSetAdmission] = Field(default_factory=list, alias="podSets", description="Per role.")

    def of(self, name: str) -> PodSetAdmission | None:
        return next((p for p in self.pod_sets if p.name == name), None)


class ContainerResources(_Status):
    """A container's resource requests and limits, quantities as the spec writes them."""

    requests: dict[str, str] | None = Field(None, description="Requests, e.g. memory: 8Gi.")
    limits: dict[str, str] | None = Field(None, description="Limits, e.g. memory: 8Gi.")

    def describe(self) -> str:
        """E.g. "8Gi, 2 cpu": memory first, each the limit (request/limit when they differ)."""
        requests, limits = self.requests or {}, self.limits or {}
        names = sorted(requests.keys() | limits.keys(), key=lambda name: (name != "memory", name))
        amounts = [_amount(requests.get(name), limits.get(name)) for name in names]
        return ", ".join(a if n == "memory" else f"{a} {n}" for n, a in zip(names, amounts, strict=True))


def _amount(request: str | None, limit: str | None) -> str:
    if request is None or limit is None or request == limit:
        return str(limit or request)
    return f"{request}/{limit}"


class Shape(_Status):
    """How many parameter servers and workers a chief attempt was started with, and the resources
    of its parameter servers."""

    ps: int = Field(..., description="Parameter servers.")
    workers: int = Field(..., description="Workers.")
    ps_resources: dict[str, ContainerResources] | None = Field(
        None,
        alias="psResources",
        description=(
            "Requests and limits of the parameter servers' containers that set any, by container "
            "name. Absent from a status an earlier version of the operator wrote: the spec's then."
        ),
    )

    def describe(self) -> str:
        """E.g. "2 PS (8Gi), 2 workers"."""
        return f"{self.ps} PS{self._describe_resources()}, {self.workers} workers"

    def _describe_resources(self) -> str:
        named = {name: r.describe() for name, r in (self.ps_resources or {}).items() if r.describe()}
        if len(named) <= 1:
            return "".join(f" ({text})" for text in named.values())
        return " (" + "; ".join(f"{name}: {text}" for name, text in named.items()) + ")"


class TrackedPod(_Status):
    """A long-running pod as the operator last saw it."""

    uid: str = Field(..., description="The pod's uid: another uid under the same name is a new pod.")
    restarts: int = Field(0, ge=0, lt=INT_LIMIT, description="Restarts of its training container.")
    sidecar_restarts: int | None = Field(
        None,
        ge=0,
        lt=INT_LIMIT,
        alias="sidecarRestarts",
        description="Restarts of its other containers, added up.",
    )
    disruption: str | None = Field(
        None,
        description=(
            "The reason of a DisruptionTarget condition first seen on it (preemption, eviction, "
            "drain): its loss is then never counted, even when the operator did not see it go."
        ),
    )

    @classmethod
    def from_entry(cls, entry: str) -> TrackedPod:
        """The record as a string, "uid/restarts/sidecar restarts/disruption": the form earlier
        versions stored (without the disruption, and the oldest without the sidecar restarts) and
        the start of a row of Tracking.stateful_sets."""
        uid, restarts, sidecars, disruption = [*entry.split("/"), "", "", ""][:4]
        return cls(
            uid=uid,
            restarts=int_of(restarts) or 0,
            sidecarRestarts=int_of(sidecars),
            disruption=disruption or None,
        )


class StartError(_Status):
    """A pod seen unable to start: the episode (its uid and restarts), since when, and whether told."""

    uid: str = Field(..., description="The pod's uid.")
    restarts: int = Field(
        ..., ge=0, lt=INT_LIMIT, description="Restarts of its training container when the episode began."
    )
    since: str = Field(..., description="When the operator first saw it unable to start (RFC 3339).")
    told: bool = Field(False, description="The failure has been recorded (an event and lastFailure).")

    @classmethod
    def from_entry(cls, entry: str) -> StartError | None:
        """The form earlier versions stored: "uid/restarts/since", then "/told"; None if unreadable."""
        parts = entry.split("/")
        restarts = int_of(parts[1]) if len(parts) >= 3 else None
        if restarts is None:
            return None
        return cls(uid=parts[0], restarts=restarts, since=parts[2], told=parts[3:] == ["told"])


Record = TypeVar("Record", TrackedPod, StartError)


def _upgraded(value: Any, record: type[Record]) -> Any:
    """Entries an earlier version wrote as strings, read as records: a job that runs through an upgrade
    keeps its tracking, and the next status write stores the records. An entry that cannot be read is
    left out (its pod is tracked afresh), so that no entry keeps the job's status from being read."""
    if not isinstance(value, dict):
        return value
    read = {name: _record(entry, record) for name, entry in value.items()}
    return {name: entry for name, entry in read.items() if entry is not None}


def _record(entry: Any, record: type[Record]) -> Record | None:
    if isinstance(entry, str):
        return record.from_entry(entry)
    try:
        return record.model_validate(entry)
    except ValidationError:
        return None


# The roles whose pods are StatefulSet pods, named <job>-<role>-<ordinal>.
_SET_ROLES = frozenset({Role.PS.value, Role.WORKER.value})


def _set_member(name: str) -> tuple[str, int] | None:
    """The StatefulSet and ordinal of a pod named <job>-<ps|worker>-<ordinal>; None for another."""
    set_name, _, ordinal = name.rpartition("-")
    canonical = ordinal.isascii() and ordinal.isdigit() and ordinal == str(int(ordinal))
    if not canonical or int(ordinal) >= MAX_WORKERS or set_name.rpartition("-")[2] not in _SET_ROLES:
        return None
    return set_name, int(ordinal)


def _row(pod: TrackedPod, error: StartError | None) -> str:
    """A row of Tracking.stateful_sets: "uid/restarts/sidecarRestarts[/disruption[/since[/told]]]"."""
    sidecars = "" if pod.sidecar_restarts is None else str(pod.sidecar_restarts)
    parts = [pod.uid, str(pod.restarts), sidecars, (pod.disruption or "").replace("/", "_")]
    if error is not None:
        parts += [error.since, "told" if error.told else ""]
    return "/".join(parts).rstrip("/")


def _from_row(row: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A row's TrackedPod and StartError, as the models validate them."""
    uid, restarts, sidecars, disruption, since, told = [*row.split("/"), "", "", "", "", ""][:6]
    count = int_of(restarts) or 0
    pod = {
        "uid": uid,
        "restarts": count,
        "sidecarRestarts": int_of(sidecars),
        "disruption": disruption or None,
    }
    return pod, {"uid": uid, "restarts": count, "since": since, "told": told == "told"} if since else None


# In memory every pod's record is in Tracking.pods and every start error in start_errors, by pod
# name. Stored, the StatefulSet pods' go to stateful_sets, a row of a few dozen bytes each, so that
# a job at the CRD's limits (1,000 parameter servers, 10,000 workers) keeps a status etcd takes; the
# CRD makes the whole object atomic, so the status write's managedFields names none of its entries.
class Tracking(_Status):
    """What the operator last saw of the long-running pods: how it tells a lost pod from a new one."""

    ps_established: bool = Field(
        False,
        alias="psEstablished",
        description="Every parameter server has run together during the current chief attempt.",
    )
    pods: dict[str, TrackedPod] = Field(
        default_factory=dict,
        description=(
            "The pods not in statefulSets (the evaluator's), by name: uid, restarts (of the "
            "training container), sidecarRestarts (of the others), disruption (a DisruptionTarget's "
            "reason). Versions before statefulSets kept every pod here."
        ),
    )
    stateful_sets: dict[str, list[str]] | None = Field(
        None,
        alias="statefulSets",
        description=(
            "The parameter server and worker pods, by StatefulSet (the pod <set>-<i> in row i, empty "
            'where there is none): "uid/restarts/sidecarRestarts", then "/disruption" if one was '
            'seen, then "/since" and "/told" if the pod cannot start (as startErrors has them).'
        ),
    )
    start_errors: dict[str, StartError] | None = Field(
        None,
        alias="startErrors",
        description=(
            "Pods whose container cannot start (image pull or container config errors), by name: "
            "uid, restarts, since (when the operator first saw it: the API gives a waiting state no "
            "time, so startupErrorGraceSeconds runs from then), told (recorded)."
        ),
    )
    recycling: dict[str, str] | None = Field(
        None,
        description=(
            "Parameter server pods restarted with the chief (not for a failure), name to uid, kept "
            "for the attempt: the new chief waits until they are gone, so no PS keeps the old "
            "chief's variables, and they are never tracked or counted as failures."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _read_rows(cls, data: Any) -> Any:
        """The rows of statefulSets, read into pods and startErrors (as their aliases name them)."""
        sets = data.get("statefulSets") if isinstance(data, dict) else None
        if not isinstance(sets, dict):
            return data
        pods = dict(_upgraded(data.get("pods") or {}, TrackedPod))
        errors = dict(_upgraded(data.get("startErrors") or {}, StartError))
        for set_name, rows in sets.items():
            for ordinal, row in enumerate(rows if isinstance(rows, list) else []):
                if isinstance(row, str) and row:
                    name = f"{set_name}-{ordinal}"
                    pods[name], error = _from_row(row)
                    if error is not None:
                        errors[name] = error
        return {**data, "statefulSets": None, "pods": pods, "startErrors": errors or None}

    @model_serializer(mode="wrap")
    def _write_rows(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """The StatefulSet pods as rows of statefulSets, with their start errors."""
        data: dict[str, Any] = handler(self)
        errors_key, sets_key = (
            ("startErrors", "statefulSets") if info.by_alias else ("start_errors", "stateful_sets")
        )
        pods, errors = data.get("pods") or {}, data.get(errors_key) or {}
        sets: dict[str, list[str]] = {}
        for name, pod in self.pods.items():
            member = _set_member(name)
            if member is None:
                continue
            error = (self.start_errors or {}).get(name)
            if error is None or not error.since or (error.uid, error.restarts) != (pod.uid, pod.restarts):
                error = None  # not this record's episode: it stays by name
            rows = sets.setdefault(member[0], [])
            rows.extend([""] * (member[1] + 1 - len(rows)))
            rows[member[1]] = _row(pod, error)
            pods.pop(name, None)
            if error is not None:
                errors.pop(name, None)
        if errors_key in data and self.start_errors and not errors:
            del data[errors_key]
        if sets:
            data[sets_key] = sets
        return data

    @field_validator("pods", mode="before")
    @classmethod
    def _pods_upgraded(cls, value: Any) -> Any:
        return _upgraded(value, TrackedPod)

    @field_validator("start_errors", mode="before")
    @classmethod
    def _start_errors_upgraded(cls, value: Any) -> Any:
        return _upgraded(value, StartError)


class PSTrainingJobStatus(_Status):
    phase: Phase = Field(
        Phase.PENDING, description="Pending, Creating, Running, Restarting, Succeeded, Failed or Suspended."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Latest observations of the job's state, one per type."
    )
    replica_statuses: dict[str, ReplicaStatus] = Field(
        default_factory=dict, alias="replicaStatuses", description="Pod counts by role."
    )
    ps_ready: str | None = Field(
        None, alias="psReady", description="Ready/desired parameter servers, e.g. 2/4 (kubectl get)."
    )
    workers_ready: str | None = Field(
        None, alias="workersReady", description="Ready/desired workers, e.g. 8/8 (kubectl get)."
    )
    restarts: int = Field(0, description="Coordinated restarts (chief restarted from the latest checkpoint).")
    counted_restarts: int = Field(
        0,
        alias="countedRestarts",
        description="Restarts counted against failurePolicy.maxRestarts; a newer checkpoint resets it.",
    )
    restart_checkpoint_step: int | None = Field(
        None, alias="restartCheckpointStep", description="Checkpoint step when the last restart happened."
    )
    tracking: Tracking = Field(default_factory=Tracking, description=Tracking.__doc__)
    step: int | None = Field(None, description="Latest global step reported by the chief.")
    step_time: str | None = Field(None, alias="stepTime", description="When the step last advanced.")
    resumed_from_step: int | None = Field(
        None, alias="resumedFromStep", description="Checkpoint step the current attempt resumed from."
    )
    checkpoint: CheckpointStatus | None = Field(None, description="The latest checkpoint seen.")
    shape: Shape | None = Field(
        None,
        description=(
            "The parameter servers and workers the running chief attempt uses, and the PS "
            "containers' resources; a resize (a change of spec.ps.replicas, spec.worker.replicas "
            "or the PS containers' resources) takes effect at the next attempt."
        ),
    )
    admission: Admission | None = Field(
        None,
        description=(
            "A queued job's admission by Kueue (the label kueue.x-k8s.io/queue-name): what its pods "
            "run with; none while it waits."
        ),
    )
    last_planned_stop: PlannedStop | None = Field(
        None,
        alias="lastPlannedStop",
        description="The latest planned stop (a suspend, a drained PS) and the checkpoint taken before it.",
    )
    last_failure: FailureRecord | None = Field(
        None, alias="lastFailure", description="The latest task failure."
    )
    start_time: str | None = Field(None, alias="startTime", description="When the job started (RFC 3339).")
    all_running_time: str | None = Field(
        None, alias="allRunningTime", description="When every pod of the job first ran at once (RFC 3339)."
    )
    completion_time: str | None = Field(
        None, alias="completionTime", description="When the job succeeded or failed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="The spec generation this status describes."
    )

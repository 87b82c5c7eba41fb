"""The contract between the operator and the training runtime in its pods.

This module is the one place both sides read: the environment the operator injects into every
training container, the exit codes the runtime uses and the failure policy understands, and the
progress document the chief serves over HTTP and writes as its termination message. It depends on
pydantic only, so the trainer image can install it without the operator's dependencies.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class Role(enum.StrEnum):
    CHIEF = "chief"
    PS = "ps"
    WORKER = "worker"
    EVALUATOR = "evaluator"


# Roles that form the TensorFlow cluster spec; TF keeps the evaluator out of it.
CLUSTER_ROLES: tuple[Role, ...] = (Role.CHIEF, Role.PS, Role.WORKER)

# Environment injected into every training container.
ENV_TF_CONFIG = "TF_CONFIG"
# Set instead of TF_CONFIG when the cluster is too large for the environment (TF_CONFIG_ENV_LIMIT):
# the path of a file (a mounted ConfigMap) holding each role's task count and one address pattern;
# see tf_config_from_file.
ENV_TF_CONFIG_FILE = "PSOP_TF_CONFIG_FILE"
ENV_ROLE = "PSOP_ROLE"
ENV_TASK_INDEX = "PSOP_TASK_INDEX"
ENV_JOB_NAME = "PSOP_JOB_NAME"
ENV_NAMESPACE = "PSOP_NAMESPACE"
ENV_POD_NAME = "PSOP_POD_NAME"
ENV_CHECKPOINT_DIR = "PSOP_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL_STEPS = "PSOP_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_INTERVAL_SECONDS = "PSOP_CHECKPOINT_INTERVAL_SECONDS"
ENV_CONNECT_TIMEOUT_SECONDS = "PSOP_CONNECT_TIMEOUT_SECONDS"
ENV_PROGRESS_PORT = "PSOP_PROGRESS_PORT"
# The chief's only: the longest hold a checkpoint request may ask for (checkpointBeforeStopSeconds).
ENV_CHECKPOINT_BEFORE_STOP_SECONDS = "PSOP_CHECKPOINT_BEFORE_STOP_SECONDS"
# The chief's only: the file holding the token the operator sends (a Secret of the job's, mounted).
# Set, the chief answers PROGRESS_PATH and CHECKPOINT_PATH only to `Authorization: Bearer <token>`
# (the file is read at each request; missing or empty, nobody is answered); unset (an older
# operator), it answers anyone, as before. /healthz and METRICS_PATH need no token.
ENV_CHIEF_TOKEN_FILE = "PSOP_CHIEF_TOKEN_FILE"
ENV_TERMINATION_MESSAGE_PATH = "PSOP_TERMINATION_MESSAGE_PATH"
# Every name above: the operator's alone, and each is TF_CONFIG or starts with RESERVED_ENV_PREFIX.
# The CRD refuses a template that sets TF_CONFIG or any such name (so a variable the operator adds
# later is reserved already), and the operator sets its own value over any that a template stored
# before that rule holds.
RESERVED_ENV_PREFIX = "PSOP_"
INJECTED_ENV: tuple[str, ...] = (
    ENV_TF_CONFIG,
    ENV_TF_CONFIG_FILE,
    ENV_ROLE,
    ENV_TASK_INDEX,
    ENV_JOB_NAME,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_INTERVAL_STEPS,
    ENV_CHECKPOINT_INTERVAL_SECONDS,
    ENV_CONNECT_TIMEOUT_SECONDS,
    ENV_PROGRESS_PORT,
    ENV_CHECKPOINT_BEFORE_STOP_SECONDS,
    ENV_CHIEF_TOKEN_FILE,
    ENV_TERMINATION_MESSAGE_PATH,
)
# The store of an s3:// checkpoint directory (spec.checkpoint.s3), for the roles that touch it, under
# the AWS SDKs' names (the addressing style has none), which the trainer's s3:// filesystem reads.
ENV_S3_ENDPOINT = "AWS_ENDPOINT_URL_S3"
ENV_S3_REGION = "AWS_REGION"
ENV_S3_ADDRESSING_STYLE = "S3_ADDRESSING_STYLE"
ENV_S3_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
ENV_S3_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"

# The chief serves GET /progress (ProgressReport as JSON) and GET /metrics (Prometheus) here.
DEFAULT_PROGRESS_PORT = 8470
# The names of the ports the operator declares on the trainer container: the task's gRPC port
# (spec.port) and the chief's progress port. The operator's alone, like INJECTED_ENV: a container
# cannot declare two ports of one name.
TASK_PORT_NAME = "tf"
PROGRESS_PORT_NAME = "progress"
INJECTED_PORT_NAMES: tuple[str, ...] = (TASK_PORT_NAME, PROGRESS_PORT_NAME)
PROGRESS_PATH = "/progress"
METRICS_PATH = "/metrics"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096


# POST here on the progress port asks the chief for a checkpoint now: it finishes the steps in flight
# (a join), saves through its CheckpointManager between two steps and answers a CheckpointAnswer.
# The parameters (CheckpointRequest) come as query parameters or as a JSON body; the query wins.
# Idempotent: a request at the step of the latest checkpoint answers that checkpoint, saved=false.
CHECKPOINT_PATH = "/checkpoint"
DEFAULT_CHECKPOINT_DEADLINE_SECONDS = 60.0
# spec.failurePolicy.checkpointBeforeStopSeconds unless the job says otherwise.
DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS = 60
# The longest deadline or hold a request may ask for.
MAX_CHECKPOINT_REQUEST_SECONDS = 3600.0


class CheckpointStatus(enum.IntEnum):
    """HTTP status of the answer to a checkpoint request."""

    # Saved, or the latest checkpoint already is at the chief's step (saved=false).
    SAVED = 200
    # A parameter that is no number or out of range: reason says which.
    BAD_REQUEST = 400
    # No `Authorization: Bearer <token>` with the token of ENV_CHIEF_TOKEN_FILE.
    UNAUTHORIZED = 401
    METHOD_NOT_ALLOWED = 405
    # The chief cannot save: not training yet, training ended, a parameter server does not answer,
    # the coordinator failed. The reason says which; the runtime stops as it would without asking.
    REFUSED = 503
    # The deadline passed before the checkpoint was written (a save already begun goes on).
    DEADLINE_EXCEEDED = 504


class CheckpointRequest(BaseModel):
    """The parameters of POST CHECKPOINT_PATH."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    deadline_seconds: float = Field(
        DEFAULT_CHECKPOINT_DEADLINE_SECONDS,
        alias="deadlineSeconds",
        gt=0,
        le=MAX_CHECKPOINT_REQUEST_SECONDS,
        description="How long the caller waits for the answer.",
    )
    hold_seconds: float = Field(
        0.0,
        alias="holdSeconds",
        ge=0,
        le=MAX_CHECKPOINT_REQUEST_SECONDS,
        description="After the save, schedule no step for this long: a stop that follows loses nothing.",
    )


# The largest step a report or an answer may give: the job's status keeps steps as 64-bit integers.
MAX_STEP = 2**63 - 1


class CheckpointAnswer(BaseModel):
    """The answer to POST CHECKPOINT_PATH: the checkpoint (status SAVED), or why there is none."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    checkpoint_step: int | None = Field(None, alias="checkpointStep", ge=0, le=MAX_STEP)
    checkpoint_path: str | None = Field(None, alias="checkpointPath")
    saved: bool = Field(False, description="Written for this request (false: it already existed).")
    reason: str | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def parse(cls, text: str | bytes | None) -> CheckpointAnswer | None:
        """Parse an answer from untrusted text; None for anything missing or garbled."""
        try:
            return cls.model_validate_json(text) if text else None
        except ValidationError:
            return None


# The largest TF_CONFIG put in the environment. Linux refuses to start a process with one environment
# string over 128 KiB (MAX_ARG_STRLEN), and every pod of the job carries its copy to etcd and to
# every watcher of pods: beyond this (about 400 tasks with typical names) it goes into a file.
TF_CONFIG_ENV_LIMIT = 32 * 1024

_EMPTY_INDEX = re.compile(r'"index":\s*(?=[,}])')


def tf_config_text(env: Mapping[str, str]) -> str | None:
    """TF_CONFIG as the runtime should read it, with the fallback for Kubernetes older than 1.28.

    StatefulSet pods get their index from the `apps.kubernetes.io/pod-index` label (1.28+). Without
    it the kubelet expands `$(PSOP_TASK_INDEX)` to nothing and TF_CONFIG reads `"index": ,`; the
    ordinal at the end of the pod's name (PSOP_POD_NAME, `<job>-<role>-<ordinal>`) is the same number.
    """
    text = env.get(ENV_TF_CONFIG)
    if text is None or env.get(ENV_TASK_INDEX, "").strip():
        return text
    ordinal = _ordinal(env)
    if not ordinal:
        return text
    return _EMPTY_INDEX.sub(f'"index": {int(ordinal)}', text)


def _ordinal(env: Mapping[str, str]) -> str:
    """The ordinal at the end of the pod's name (`<job>-<role>-<ordinal>`), or ""."""
    ordinal = env.get(ENV_POD_NAME, "").rsplit("-", 1)[-1]
    return ordinal if ordinal.isdigit() else ""


# Where a task's role and index go in the address pattern of a cluster file.
ROLE_FIELD, INDEX_FIELD = "{role}", "{index}"


def task_address_of(pattern: str, role: str, index: int) -> str:
    """A task's address from its cluster's pattern, `<job>-{role}-{index}.<job>-{role}.<ns>.svc...`."""
    return pattern.replace(ROLE_FIELD, role).replace(INDEX_FIELD, str(index))


def cluster_file_text(tasks: Mapping[str, int], pattern: str) -> str:
    """A cluster as its file holds it: a few hundred bytes whatever its size (a ConfigMap holds
    1 MiB at most, and listing 11,000 addresses of a long namespace would take 2)."""
    return json.dumps({"address": pattern, "tasks": dict(tasks)}, sort_keys=True, separators=(",", ":"))


def tf_config_from_file(cluster_text: str, env: Mapping[str, str]) -> str:
    """TF_CONFIG of a task whose cluster came in a file: every task's address from the file's
    counts and pattern, and the task from PSOP_ROLE and PSOP_TASK_INDEX (the pod's ordinal where
    the index is empty, before 1.28).

    Not a cluster file (cluster_file_text): ValueError. An index that is no number is left for the
    reader to refuse.
    """
    data = json.loads(cluster_text)
    tasks, pattern = (data.get("tasks"), data.get("address")) if isinstance(data, dict) else (None, None)
    if not (isinstance(tasks, dict) and isinstance(pattern, str) and INDEX_FIELD in pattern):
        raise ValueError('not a cluster file: an "address" pattern with {index} and "tasks" are needed')
    if not all(isinstance(n, int) and n >= 0 for n in tasks.values()):
        raise ValueError('"tasks" must count each role\'s tasks')
    cluster = {role: [task_address_of(pattern, role, i) for i in range(n)] for role, n in tasks.items()}
    index = env.get(ENV_TASK_INDEX, "").strip() or _ordinal(env)
    task = {"type": env.get(ENV_ROLE, ""), "index": int(index) if index.isdigit() else index}
    return json.dumps({"cluster": cluster, "task": task}, sort_keys=True)


class ExitCode(enum.IntEnum):
    """Exit codes of the training runtime, and what the operator's failure policy makes of them."""

    SUCCEEDED = 0
    # A bug in user code (an exception that is not a transient TensorFlow error): retrying cannot help.
    PERMANENT = 1
    # TF_CONFIG, the environment or the arguments are wrong: retrying cannot help.
    BAD_CONFIG = 2
    # Unavailable, Aborted, DeadlineExceeded, Cancelled, or a peer that never came: restart and resume.
    RETRYABLE = 138
    # 128 + SIGTERM: the pod was asked to stop (deletion, eviction, preemption).
    TERMINATED = 143


# Exit codes that the default failure policy treats as final. Plain ints, not ExitCode members:
# they become spec values, which YAML serialisers cannot write as enum members.
DEFAULT_PERMANENT_EXIT_CODES: tuple[int, ...] = (int(ExitCode.PERMANENT), int(ExitCode.BAD_CONFIG))


# The latest checkpointTime: 9999-12-31T23:59:59Z, the last second an RFC 3339 time can name.
LATEST_UNIX_SECONDS = 253402300799.0
# The longest checkpointPath a report may give (Linux's PATH_MAX): the job's status keeps it.
MAX_PATH_LENGTH = 4096


@dataclass(frozen=True)
class RejectedReport:
    """A JSON object offered as a progress report that the operator does not use, and why."""

    reason: str


class ProgressReport(BaseModel):
    """What the chief reports about training: served at PROGRESS_PATH, written as termination message.

    Every value the job's status keeps is bounded here, so that a report can never make the status
    unwritable: steps fit 64 bits, the checkpoint time is Unix seconds an RFC 3339 time can name,
    the checkpoint path is no longer than a path can be."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    state: Literal["starting", "running", "succeeded", "failed"] = "starting"
    step: int = Field(0, ge=0, le=MAX_STEP, description="Global step the chief has reached.")
    total_steps: int | None = Field(None, alias="totalSteps", ge=0, le=MAX_STEP)
    resumed_from_step: int | None = Field(None, alias="resumedFromStep", ge=0, le=MAX_STEP)
    checkpoint_step: int | None = Field(None, alias="checkpointStep", ge=0, le=MAX_STEP)
    checkpoint_path: str | None = Field(None, alias="checkpointPath", max_length=MAX_PATH_LENGTH)
    checkpoint_time: float | None = Field(None, alias="checkpointTime", description="Unix seconds.")
    examples_per_second: float | None = Field(None, alias="examplesPerSecond")
    loss: float | None = None
    exit_code: int | None = Field(None, alias="exitCode")
    message: str | None = None

    @field_validator("checkpoint_time")
    @classmethod
    def _unix_seconds(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= LATEST_UNIX_SECONDS:  # NaN is neither
            raise ValueError(f"must be Unix seconds from 0 to {LATEST_UNIX_SECONDS:.0f}, not milliseconds")
        return value

    def to_json(self) -> str:
        """Compact JSON that fits a termination message."""
        text = self.model_dump_json(by_alias=True, exclude_none=True)
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT and self.message:
            trimmed = self.model_copy(update={"message": self.message[:512]})
            text = trimmed.model_dump_json(by_alias=True, exclude_none=True)
        return text

    @classmethod
    def read(cls, text: str | bytes | None) -> ProgressReport | RejectedReport | None:
        """A report from untrusted text. None when there is none: no text, or text that is no JSON
        object (the log tail the kubelet keeps when a plain image wrote no termination message). A
        JSON object that is no valid report (a value out of range, of a wrong type) is rejected,
        saying why."""
        if not text:
            return None
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(data, dict):
            return None
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            return RejectedReport(_describe(error))

    @classmethod
    def parse(cls, text: str | bytes | None) -> ProgressReport | None:
        """A report from untrusted text; None for anything missing, garbled or invalid."""
        report = cls.read(text)
        return report if isinstance(report, ProgressReport) else None


def _describe(error: ValidationError) -> str:
    """What is wrong with each field, as `checkpointTime: must be ... (got 1.7e+12)`."""
    parts = []
    for problem in error.errors(include_url=False):
        field = ".".join(map(str, problem["loc"])) or "report"
        message = str(problem["msg"]).removeprefix("Value error, ")
        parts.append(f"{field}: {message} (got {json.dumps(problem['input'])[:64]})")
    return "; ".join(parts)[:512]

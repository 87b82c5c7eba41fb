"""The contract between the operator and the training runtime in its pods.

This module is the one place both sides read: the environment the operator injects into every
training container, the exit codes the runtime uses and the failure policy understands, and the
documents the chief serves over HTTP (the progress report, the checkpoint request and its answer).
The operator imports it as `psoperator.contract`; the runtime library installs into a user's
TensorFlow image, so it depends on nothing but the standard library: the documents are dataclasses
whose fields name their JSON key and bounds, validated here for both sides.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Self

__all__ = [
    "CHECKPOINT_PATH",
    "CLUSTER_ROLES",
    "DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS",
    "DEFAULT_CHECKPOINT_DEADLINE_SECONDS",
    "DEFAULT_PERMANENT_EXIT_CODES",
    "DEFAULT_PROGRESS_PORT",
    "ENV_CHECKPOINT_BEFORE_STOP_SECONDS",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_INTERVAL_SECONDS",
    "ENV_CHECKPOINT_INTERVAL_STEPS",
    "ENV_CHIEF_TOKEN_FILE",
    "ENV_CONNECT_TIMEOUT_SECONDS",
    "ENV_JOB_NAME",
    "ENV_NAMESPACE",
    "ENV_POD_NAME",
    "ENV_PROGRESS_PORT",
    "ENV_ROLE",
    "ENV_S3_ACCESS_KEY_ID",
    "ENV_S3_ADDRESSING_STYLE",
    "ENV_S3_ENDPOINT",
    "ENV_S3_REGION",
    "ENV_S3_SECRET_ACCESS_KEY",
    "ENV_TASK_INDEX",
    "ENV_TERMINATION_MESSAGE_PATH",
    "ENV_TF_CONFIG",
    "ENV_TF_CONFIG_FILE",
    "INDEX_FIELD",
    "INJECTED_ENV",
    "INJECTED_PORT_NAMES",
    "LATEST_UNIX_SECONDS",
    "MAX_CHECKPOINT_REQUEST_SECONDS",
    "MAX_PATH_LENGTH",
    "MAX_STEP",
    "METRICS_PATH",
    "PROGRESS_PATH",
    "PROGRESS_PORT_NAME",
    "RESERVED_ENV_PREFIX",
    "ROLE_FIELD",
    "TASK_PORT_NAME",
    "TERMINATION_MESSAGE_LIMIT",
    "TERMINATION_MESSAGE_PATH",
    "TF_CONFIG_ENV_LIMIT",
    "CheckpointAnswer",
    "CheckpointRequest",
    "CheckpointStatus",
    "ExitCode",
    "Invalid",
    "ProgressReport",
    "RejectedReport",
    "Role",
    "cluster_file_text",
    "task_address_of",
    "tf_config_from_file",
    "tf_config_text",
]


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


# The largest step a report may give: the job's status keeps steps as 64-bit integers.
MAX_STEP = 2**63 - 1
# The latest checkpointTime: 9999-12-31T23:59:59Z, the last second an RFC 3339 time can name.
LATEST_UNIX_SECONDS = 253402300799.0
# The longest checkpointPath a report may give (Linux's PATH_MAX): the job's status keeps it.
MAX_PATH_LENGTH = 4096


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


class Invalid(ValueError):
    """A document's fields hold values the contract does not allow; the message names each field."""


# A value's check: the value as the document keeps it, or ValueError saying what is wrong.
Check = Callable[[Any], Any]


def _wire(name: str, check: Check, default: Any = None) -> Any:
    """A document's field: its JSON name and its check."""
    return field(default=default, metadata={"json": name, "check": check})


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {high}")
        return value

    return check


def _number(
    low: float = -math.inf, high: float = math.inf, above: bool = False, finite: bool = False
) -> Check:
    """A number from low (excluded when `above`) to high; NaN and the infinities only when not `finite`."""

    def check(value: Any) -> float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError("must be a number") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        number = float(value)
        if not math.isfinite(number):
            if finite:
                raise ValueError("must be a finite number")
            return number
        if not (low < number if above else low <= number) or not number <= high:
            raise ValueError(f"must be {'above' if above else 'at least'} {low:g} and at most {high:g}")
        return number

    return check


def _text(max_length: int | None = None) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"must be at most {max_length} characters")
        return value

    return check


def _choice(*choices: str) -> Check:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


class _Document:
    """A JSON object of the contract, read and written by its fields' JSON names (`_wire`)."""

    @classmethod
    def from_json_object(cls, data: Mapping[str, Any]) -> Self:
        """The document from a JSON object's fields (unknown ones ignored); Invalid naming each
        field whose value is not allowed, and what it held."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for spec in fields(cls):  # type: ignore[arg-type]
            name = spec.metadata["json"]
            if name not in data:
                continue
            try:
                values[spec.name] = spec.metadata["check"](data[name])
            except ValueError as err:
                problems.append(f"{name}: {err} (got {json.dumps(data[name])[:64]})")
        if problems:
            raise Invalid("; ".join(problems)[:512])
        return cls(**values)

    @classmethod
    def _from_text(cls, text: str | bytes) -> Self | None:
        """The document from JSON text; None when it is no JSON object, Invalid when a field is bad."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            return None
        return cls.from_json_object(data) if isinstance(data, dict) else None

    def to_json(self) -> str:
        """Compact JSON of the fields that are set."""
        present = {
            spec.metadata["json"]: getattr(self, spec.name)
            for spec in fields(self)  # type: ignore[arg-type]
            if getattr(self, spec.name) is not None
        }
        return json.dumps(present, separators=(",", ":"))

    def replace(self, **changes: Any) -> Self:
        """A copy with these fields (python names) changed."""
        return replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class CheckpointRequest(_Document):
    """The parameters of POST CHECKPOINT_PATH."""

    # How long the caller waits for the answer.
    deadline_seconds: float = _wire(
        "deadlineSeconds",
        _number(0, MAX_CHECKPOINT_REQUEST_SECONDS, above=True, finite=True),
        DEFAULT_CHECKPOINT_DEADLINE_SECONDS,
    )
    # After the save, schedule no step for this long: a stop that follows loses nothing.
    hold_seconds: float = _wire("holdSeconds", _number(0, MAX_CHECKPOINT_REQUEST_SECONDS, finite=True), 0.0)


@dataclass(frozen=True)
class CheckpointAnswer(_Document):
    """The answer to POST CHECKPOINT_PATH: the checkpoint (status SAVED), or why there is none."""

    checkpoint_step: int | None = _wire("checkpointStep", _optional(_integer(0, MAX_STEP)))
    checkpoint_path: str | None = _wire("checkpointPath", _optional(_text(MAX_PATH_LENGTH)))
    # Written for this request (false: it already existed).
    saved: bool = _wire("saved", _flag, False)
    reason: str | None = _wire("reason", _optional(_text()))

    @classmethod
    def parse(cls, text: str | bytes | None) -> CheckpointAnswer | None:
        """Parse an answer from untrusted text; None for anything missing or garbled."""
        try:
            return cls._from_text(text) if text else None
        except Invalid:
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


@dataclass(frozen=True)
class RejectedReport:
    """A JSON object offered as a progress report that the operator does not use, and why."""

    reason: str


def _unix_seconds(value: Any) -> float:
    seconds: float = _number()(value)
    if not 0 <= seconds <= LATEST_UNIX_SECONDS:  # NaN is neither
        raise ValueError(f"must be Unix seconds from 0 to {LATEST_UNIX_SECONDS:.0f}, not milliseconds")
    return seconds


@dataclass(frozen=True)
class ProgressReport(_Document):
    """What the chief reports about training: served at PROGRESS_PATH, written as termination message.

    Every value the job's status keeps is bounded here, so that a report can never make the status
    unwritable: steps fit 64 bits, the checkpoint time is Unix seconds an RFC 3339 time can name,
    the checkpoint path is no longer than a path can be."""

    state: Literal["starting", "running", "succeeded", "failed"] = _wire(
        "state", _choice("starting", "running", "succeeded", "failed"), "starting"
    )
    # Global step the chief has reached.
    step: int = _wire("step", _integer(0, MAX_STEP), 0)
    total_steps: int | None = _wire("totalSteps", _optional(_integer(0, MAX_STEP)))
    resumed_from_step: int | None = _wire("resumedFromStep", _optional(_integer(0, MAX_STEP)))
    checkpoint_step: int | None = _wire("checkpointStep", _optional(_integer(0, MAX_STEP)))
    checkpoint_path: str | None = _wire("checkpointPath", _optional(_text(MAX_PATH_LENGTH)))
    # Unix seconds.
    checkpoint_time: float | None = _wire("checkpointTime", _optional(_unix_seconds))
    examples_per_second: float | None = _wire("examplesPerSecond", _optional(_number()))
    loss: float | None = _wire("loss", _optional(_number()))
    exit_code: int | None = _wire("exitCode", _optional(_integer(-(2**31), 2**31 - 1)))
    message: str | None = _wire("message", _optional(_text()))

    def to_json(self) -> str:
        """Compact JSON that fits a termination message."""
        text = super().to_json()
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT and self.message:
            text = self.replace(message=self.message[:512]).to_json()
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
            return cls._from_text(text)
        except Invalid as error:
            return RejectedReport(str(error))

    @classmethod
    def parse(cls, text: str | bytes | None) -> ProgressReport | None:
        """A report from untrusted text; None for anything missing, garbled or invalid."""
        report = cls.read(text)
        return report if isinstance(report, ProgressReport) else None

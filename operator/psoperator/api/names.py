"""Names, labels and DNS addresses of a job's children: one place, so every renderer and view agrees."""

from __future__ import annotations

from psoperator.api.labels import LABEL_JOB, LABEL_ROLE
from psoperator.contract import INDEX_FIELD, ROLE_FIELD, Role, task_address_of

APP_NAME = "pstrainingjob"
MANAGER = "ps-training-operator"

CHECKPOINT_VOLUME = "psoperator-checkpoint"
# A cluster too large for the environment: a ConfigMap mounted here in every container.
TF_CONFIG_VOLUME = "psoperator-tf-config"
TF_CONFIG_DIR = "/etc/psoperator/tf-config"
TF_CONFIG_FILE = "cluster.json"
# The chief's token (control/chief_key.py): the job's Secret, mounted in the chief's trainer alone.
CHIEF_TOKEN_VOLUME = "psoperator-chief-token"
CHIEF_TOKEN_DIR = "/var/run/secrets/psoperator.io/chief-token"
CHIEF_TOKEN_KEY = "token"


def child_name(job_name: str, role: Role) -> str:
    """Name of a role's Service, StatefulSet or Job: `<job>-<role>`."""
    return f"{job_name}-{role.value}"


def pod_hostname(job_name: str, role: Role, index: int) -> str:
    """Hostname of a task's pod; equals the pod name for StatefulSet pods."""
    return f"{child_name(job_name, role)}-{index}"


def task_address_pattern(job_name: str, namespace: str, port: int, domain: str) -> str:
    """Every task's address, `<pod_hostname>.<child_name>.<namespace>.svc.<domain>:<port>`
    (resolvable through the role's headless Service), its role and index left as contract's fields."""
    service = f"{job_name}-{ROLE_FIELD}"
    return f"{service}-{INDEX_FIELD}.{service}.{namespace}.svc.{domain}:{port}"


def task_address(job_name: str, namespace: str, role: Role, index: int, port: int, domain: str) -> str:
    return task_address_of(task_address_pattern(job_name, namespace, port, domain), role.value, index)


def tf_config_map_name(job_name: str) -> str:
    return f"{job_name}-tf-config"


def chief_token_secret_name(job_name: str, job_uid: str) -> str:
    """The Secret of the job's chief token: named for this job, not another of its name (one just
    deleted, whose Secret the garbage collector has not removed yet, holds another token)."""
    return f"{job_name}-chief-token-{job_uid[:8]}"


def selector_labels(job_name: str, role: Role) -> dict[str, str]:
    """The labels that select one role's pods; immutable once a StatefulSet exists."""
    return {LABEL_JOB: job_name, LABEL_ROLE: role.value}


def job_labels(job_name: str, component: str) -> dict[str, str]:
    """Labels on every child of a job; LABEL_JOB is how the operator lists them."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGER,
        LABEL_JOB: job_name,
    }


def child_labels(job_name: str, role: Role) -> dict[str, str]:
    """Labels on every child object and pod of a role."""
    return {**job_labels(job_name, role.value), **selector_labels(job_name, role)}

"""The pod template of a role: the user's template plus what the operator owes every training pod.

Added: labels, the default image, TF_CONFIG and the contract's environment in every container, the
task port, the checkpoint volume, scheduling settings. What the user set wins over our defaults,
except the labels that select the pods and the environment that must be right for TF to work.
"""

from __future__ import annotations

import copy
from typing import Any

from psoperator import contract
from psoperator.api.labels import ANNOTATION_TRAINER_CONTAINER, LABEL_ATTEMPT, LABEL_POD_INDEX
from psoperator.api.models import PSTrainingJobSpec
from psoperator.contract import Role
from psoperator.render.names import (
    CHECKPOINT_VOLUME,
    TF_CONFIG_DIR,
    TF_CONFIG_FILE,
    TF_CONFIG_VOLUME,
    child_labels,
    child_name,
    tf_config_map_name,
)

Manifest = dict[str, Any]

_URI_PREFIXES = ("gs://", "s3://")


def is_uri(checkpoint_dir: str) -> bool:
    return checkpoint_dir.startswith(_URI_PREFIXES)


def _field_env(name: str, field_path: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def contract_env(
    spec: PSTrainingJobSpec, job_name: str, role: Role, index: int | None, tf_config: str | None
) -> list[Manifest]:
    """The environment of the contract; index None takes the pod's index from its StatefulSet label;
    tf_config None names the file of the cluster instead (see tfconfig.py)."""
    env: list[Manifest] = [
        {"name": contract.ENV_ROLE, "value": role.value},
        {"name": contract.ENV_JOB_NAME, "value": job_name},
        _field_env(contract.ENV_NAMESPACE, "metadata.namespace"),
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_TASK_INDEX, f"metadata.labels['{LABEL_POD_INDEX}']")
        if index is None
        else {"name": contract.ENV_TASK_INDEX, "value": str(index)},
        {"name": contract.ENV_CHECKPOINT_DIR, "value": spec.checkpoint.dir},
        {
            "name": contract.ENV_CONNECT_TIMEOUT_SECONDS,
            "value": str(spec.failure_policy.connect_timeout_seconds),
        },
        {"name": contract.ENV_PROGRESS_PORT, "value": str(contract.DEFAULT_PROGRESS_PORT)},
        {"name": contract.ENV_TERMINATION_MESSAGE_PATH, "value": contract.TERMINATION_MESSAGE_PATH},
    ]
    if spec.checkpoint.interval_steps is not None:
        env.append(
            {"name": contract.ENV_CHECKPOINT_INTERVAL_STEPS, "value": str(spec.checkpoint.interval_steps)}
        )
    if spec.checkpoint.interval_seconds is not None:
        env.append(
            {"name": contract.ENV_CHECKPOINT_INTERVAL_SECONDS, "value": str(spec.checkpoint.interval_seconds)}
        )
    if tf_config is None:
        env.append({"name": contract.ENV_TF_CONFIG_FILE, "value": f"{TF_CONFIG_DIR}/{TF_CONFIG_FILE}"})
    else:  # last: it may reference $(PSOP_TASK_INDEX), which must be defined before it
        env.append({"name": contract.ENV_TF_CONFIG, "value": tf_config})
    return env


def storage_env(spec: PSTrainingJobSpec, role: Role) -> list[Manifest]:
    """The store's settings and the credentials' Secret for the roles that touch an s3:// checkpoint
    directory: the chief, the parameter servers (each writes and reads its own shards) and the
    evaluator; the workers only when they read training data from the store (shareWithWorkers)."""
    s3 = spec.checkpoint.s3
    if s3 is None or (role is Role.WORKER and not s3.share_with_workers):
        return []
    settings = [
        (contract.ENV_S3_ENDPOINT, s3.endpoint),
        (contract.ENV_S3_REGION, s3.region),
        (contract.ENV_S3_ADDRESSING_STYLE, s3.addressing_style),
    ]
    env: list[Manifest] = [{"name": name, "value": value} for name, value in settings if value]
    secret = s3.credentials_secret
    if secret is not None:
        for name, key in (
            (contract.ENV_S3_ACCESS_KEY_ID, secret.access_key_id_key),
            (contract.ENV_S3_SECRET_ACCESS_KEY, secret.secret_access_key_key),
        ):
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}})
    return env


# Set by the operator whatever the user's template says: TensorFlow must find its cluster.
_OWN_ENV = frozenset({contract.ENV_TF_CONFIG, contract.ENV_TF_CONFIG_FILE, contract.ENV_TASK_INDEX})


def _merge_env(ours: list[Manifest], theirs: list[Manifest]) -> list[Manifest]:
    """Ours first so the user's env can reference it; a name the user sets is theirs, except TF_CONFIG."""
    user_names = {e.get("name") for e in theirs} - _OWN_ENV
    kept_theirs = [e for e in theirs if e.get("name") not in _OWN_ENV]
    return [e for e in ours if e["name"] not in user_names] + kept_theirs


def _with_port(container: Manifest, name: str, port: int) -> None:
    ports = container.setdefault("ports", [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": name, "containerPort": port, "protocol": "TCP"})


def trainer_container_name(template: Manifest) -> str | None:
    """The container that runs the training code: the one the template's annotation names, else the first.

    A name that matches no container falls back to the first too: an annotation that names nothing
    would leave every failure of the trainer unseen.
    """
    names = [c.get("name") for c in template.get("spec", {}).get("containers", [])]
    marked = template.get("metadata", {}).get("annotations", {}).get(ANNOTATION_TRAINER_CONTAINER)
    if marked in names:
        return str(marked)
    return str(names[0]) if names else None


_OWN_VOLUMES = frozenset({CHECKPOINT_VOLUME, TF_CONFIG_VOLUME})


def _our_volumes(
    spec: PSTrainingJobSpec, job_name: str, tf_config: str | None, pod_spec: Manifest
) -> list[Manifest]:
    """Put the checkpoint volume and, without `tf_config`, the job's TF_CONFIG ConfigMap into the
    pod spec (replacing any of the same name); return the mounts every container gets."""
    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in _OWN_VOLUMES]
    mounts: list[Manifest] = []
    if spec.checkpoint.volume is not None and not is_uri(spec.checkpoint.dir):
        volumes.append({"name": CHECKPOINT_VOLUME, **spec.checkpoint.volume})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.dir})
    if tf_config is None:
        volumes.append({"name": TF_CONFIG_VOLUME, "configMap": {"name": tf_config_map_name(job_name)}})
        mounts.append({"name": TF_CONFIG_VOLUME, "mountPath": TF_CONFIG_DIR, "readOnly": True})
    if volumes or "volumes" in pod_spec:
        pod_spec["volumes"] = volumes
    return mounts


def render_pod_template(
    spec: PSTrainingJobSpec,
    job_name: str,
    role: Role,
    template: Manifest,
    tf_config: str | None,
    *,
    index: int | None,
    restart_policy: str,
    attempt: int | None = None,
) -> Manifest:
    """The full pod template of one role. `index` None: a StatefulSet's pods, indexed by the kubelet;
    `tf_config` None: the cluster comes from the job's ConfigMap, mounted in every container."""
    pod = copy.deepcopy(template)
    meta = pod.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **child_labels(job_name, role)}
    if attempt is not None:
        meta["labels"][LABEL_ATTEMPT] = str(attempt)
    trainer = trainer_container_name(pod)
    if trainer is not None:
        # Sidecars are told apart by this name, never by position: see observe.parse_pod.
        meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION_TRAINER_CONTAINER: trainer}
    pod_spec = pod.setdefault("spec", {})
    pod_spec["restartPolicy"] = restart_policy
    if spec.scheduling.scheduler_name and "schedulerName" not in pod_spec:
        pod_spec["schedulerName"] = spec.scheduling.scheduler_name
    if spec.scheduling.priority_class_name and "priorityClassName" not in pod_spec:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    # Training pods talk to each other, not to the API server: no token unless the user asks for one.
    pod_spec.setdefault("automountServiceAccountToken", False)

    env = storage_env(spec, role) + contract_env(spec, job_name, role, index, tf_config)
    mounts = _our_volumes(spec, job_name, tf_config, pod_spec)
    containers: list[Manifest] = pod_spec.setdefault("containers", [])
    for container in containers:
        if not container.get("image") and spec.image:
            container["image"] = spec.image
        container["env"] = _merge_env(env, container.get("env", []))
        theirs = [m for m in container.get("volumeMounts", []) if m.get("name") not in _OWN_VOLUMES]
        if theirs or mounts or "volumeMounts" in container:
            container["volumeMounts"] = theirs + mounts
        if container.get("name") == trainer:
            # The trainer serves the task's gRPC port and, in the chief, the progress report.
            if role is not Role.EVALUATOR:
                _with_port(container, "tf", spec.port)
            if role is Role.CHIEF:
                _with_port(container, "progress", contract.DEFAULT_PROGRESS_PORT)
                container.setdefault("terminationMessagePath", contract.TERMINATION_MESSAGE_PATH)
                container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    pod_spec.setdefault("subdomain", child_name(job_name, role))
    return pod

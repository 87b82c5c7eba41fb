"""The pod template of a role: the user's template plus what the operator owes every training pod.

Added: labels, the default image, TF_CONFIG and the contract's environment in every container, the
task port, the checkpoint volume, scheduling settings. What the user set wins over our defaults,
except the labels that select the pods, the contract's environment (contract.INJECTED_ENV) and the
names of the ports the operator declares (contract.INJECTED_PORT_NAMES): those are the operator's.
The CRD refuses a template that sets them; one stored before it did is overridden (`overridden`).
"""

from __future__ import annotations

import copy
from typing import Any

from psoperator import contract
from psoperator.api.labels import ANNOTATION_TRAINER_CONTAINER, LABEL_ATTEMPT, LABEL_POD_INDEX
from psoperator.api.models import PSTrainingJobSpec
from psoperator.api.names import (
    CHECKPOINT_VOLUME,
    CHIEF_TOKEN_DIR,
    CHIEF_TOKEN_KEY,
    CHIEF_TOKEN_VOLUME,
    TF_CONFIG_DIR,
    TF_CONFIG_FILE,
    TF_CONFIG_VOLUME,
    child_labels,
    child_name,
    tf_config_map_name,
)
from psoperator.contract import Role

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


def chief_env(spec: PSTrainingJobSpec) -> list[Manifest]:
    """What the chief's trainer container alone gets besides the contract's environment."""
    seconds = spec.failure_policy.checkpoint_before_stop_seconds
    return [
        {"name": contract.ENV_CHECKPOINT_BEFORE_STOP_SECONDS, "value": str(seconds)},
        {"name": contract.ENV_CHIEF_TOKEN_FILE, "value": f"{CHIEF_TOKEN_DIR}/{CHIEF_TOKEN_KEY}"},
    ]


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


_OWN_ENV = frozenset(contract.INJECTED_ENV)
_OWN_PORT_NAMES = frozenset(contract.INJECTED_PORT_NAMES)


def _merge_env(ours: list[Manifest], theirs: list[Manifest]) -> list[Manifest]:
    """Ours first, so the user's env can reference it; the user's entries of our names are dropped."""
    return ours + [e for e in theirs if e.get("name") not in _OWN_ENV]


def _without_our_port_names(container: Manifest) -> None:
    if "ports" in container:
        container["ports"] = [p for p in container["ports"] if p.get("name") not in _OWN_PORT_NAMES]


def _with_port(container: Manifest, name: str, port: int) -> None:
    """Declare `port` as `name`, unless the template declares that number under a name of its own."""
    ports = container.setdefault("ports", [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": name, "containerPort": port, "protocol": "TCP"})


def overridden(spec: PSTrainingJobSpec) -> list[str]:
    """What of the templates the operator sets over: env entries of the contract's names and ports
    of the names it declares, as "spec.<role>.template.spec.containers[<i>].env[<name>]" (or ports)."""
    found = []
    for role, template in role_templates(spec).items():
        for i, container in enumerate(template.get("spec", {}).get("containers", [])):
            where = f"spec.{role}.template.spec.containers[{i}]"
            env = [e["name"] for e in container.get("env", []) if e.get("name") in _OWN_ENV]
            ports = [p["name"] for p in container.get("ports", []) if p.get("name") in _OWN_PORT_NAMES]
            found += [f"{where}.env[{name}]" for name in env] + [f"{where}.ports[{name}]" for name in ports]
    return found


def role_templates(spec: PSTrainingJobSpec) -> dict[Role, Manifest]:
    """Each role's template as the spec has it; the evaluator's only when there is one."""
    roles = {Role.CHIEF: spec.chief.template, Role.PS: spec.ps.template, Role.WORKER: spec.worker.template}
    if spec.evaluator:
        roles[Role.EVALUATOR] = spec.evaluator.template
    return roles


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


_OWN_VOLUMES = frozenset({CHECKPOINT_VOLUME, TF_CONFIG_VOLUME, CHIEF_TOKEN_VOLUME})


def _our_volumes(
    spec: PSTrainingJobSpec,
    job_name: str,
    tf_config: str | None,
    token_secret: str | None,
    pod_spec: Manifest,
) -> tuple[list[Manifest], list[Manifest]]:
    """Put the checkpoint volume, without `tf_config` the job's TF_CONFIG ConfigMap, and with
    `token_secret` (the chief's) the Secret of its token into the pod spec (replacing any of the
    same name); return the mounts every container gets, and those the trainer alone gets.

    The Secret is optional: a chief whose Secret could not be made (the operator's RBAC lacks it,
    and says so in a ChildRejected event) still trains; its progress port then answers nobody.
    """
    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in _OWN_VOLUMES]
    mounts: list[Manifest] = []
    if spec.checkpoint.volume is not None and not is_uri(spec.checkpoint.dir):
        volumes.append({"name": CHECKPOINT_VOLUME, **spec.checkpoint.volume})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.dir})
    if tf_config is None:
        volumes.append({"name": TF_CONFIG_VOLUME, "configMap": {"name": tf_config_map_name(job_name)}})
        mounts.append({"name": TF_CONFIG_VOLUME, "mountPath": TF_CONFIG_DIR, "readOnly": True})
    trainer_mounts: list[Manifest] = []
    if token_secret is not None:
        secret = {"secretName": token_secret, "optional": True}
        volumes.append({"name": CHIEF_TOKEN_VOLUME, "secret": secret})
        trainer_mounts.append({"name": CHIEF_TOKEN_VOLUME, "mountPath": CHIEF_TOKEN_DIR, "readOnly": True})
    if volumes or "volumes" in pod_spec:
        pod_spec["volumes"] = volumes
    return mounts, trainer_mounts


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
    token_secret: str | None = None,
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
    mounts, trainer_mounts = _our_volumes(spec, job_name, tf_config, token_secret, pod_spec)
    containers: list[Manifest] = pod_spec.setdefault("containers", [])
    for container in containers:
        if not container.get("image") and spec.image:
            container["image"] = spec.image
        is_trainer = container.get("name") == trainer
        own = env + chief_env(spec) if role is Role.CHIEF and is_trainer else env
        container["env"] = _merge_env(own, container.get("env", []))
        _without_our_port_names(container)
        theirs = [m for m in container.get("volumeMounts", []) if m.get("name") not in _OWN_VOLUMES]
        ours = mounts + trainer_mounts if is_trainer else mounts
        if theirs or ours or "volumeMounts" in container:
            container["volumeMounts"] = theirs + ours
        if container.get("name") == trainer:
            # The trainer serves the task's gRPC port and, in the chief, the progress report.
            if role is not Role.EVALUATOR:
                _with_port(container, contract.TASK_PORT_NAME, spec.port)
            if role is Role.CHIEF:
                _with_port(container, contract.PROGRESS_PORT_NAME, contract.DEFAULT_PROGRESS_PORT)
                container.setdefault("terminationMessagePath", contract.TERMINATION_MESSAGE_PATH)
                container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    pod_spec.setdefault("subdomain", child_name(job_name, role))
    return pod

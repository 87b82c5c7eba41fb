"""The renderers: golden output, determinism, and TF_CONFIG as TensorFlow reads it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from psoperator import contract
from psoperator.api.labels import ANNOTATION_HASH, ANNOTATION_TRAINER_CONTAINER, LABEL_ATTEMPT
from psoperator.api.models import MAX_REPLICAS, MAX_WORKERS, PSTrainingJobSpec
from psoperator.contract import Role
from psoperator.render import RenderOptions, render_chief_token, render_children
from psoperator.render.pod import chief_env, contract_env
from tests.unit.builders import JOB, NS, job

GOLDEN = Path(__file__).parent / "golden"
POD_OWNERS = ("StatefulSet", "Job")
EXAMPLE = Path(__file__).parents[2] / "examples" / "ctr-job.yaml"


def _by_kind(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _kubelet_tf_config(container: dict[str, Any], index: int) -> dict[str, Any]:
    """TF_CONFIG after the kubelet expands $(PSOP_TASK_INDEX) from the pod-index label."""
    value = _env(container)["TF_CONFIG"]
    parsed: dict[str, Any] = json.loads(re.sub(r"\$\(PSOP_TASK_INDEX\)", str(index), value))
    return parsed


def _example() -> dict[str, Any]:
    # The example file also holds the checkpoints' PersistentVolumeClaim.
    obj: dict[str, Any] = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "PSTrainingJob"
    )
    obj["metadata"].update(namespace="default", uid="11111111-2222-3333-4444-555555555555")
    return obj


def test_example_matches_golden_file() -> None:
    options = RenderOptions(operator_namespace="psoperator-system")
    rendered = yaml.safe_dump_all(render_children(_example(), options), sort_keys=True)
    golden = GOLDEN / "ctr-job.children.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text(), "rendering changed: rerun with UPDATE_GOLDEN=1 and review the diff"


def test_rendering_twice_is_identical() -> None:
    assert render_children(_example()) == render_children(_example())


def test_children_of_a_job() -> None:
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in render_children(job()))
    assert kinds == [
        ("Job", "ctr-chief"),
        ("NetworkPolicy", "ctr-peers"),
        ("Service", "ctr-chief"),
        ("Service", "ctr-ps"),
        ("Service", "ctr-worker"),
        ("StatefulSet", "ctr-ps"),
        ("StatefulSet", "ctr-worker"),
    ]


def test_every_child_is_owned_labelled_and_hashed() -> None:
    for manifest in render_children(job()):
        meta = manifest["metadata"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "psoperator.io/v1alpha1",
                "kind": "PSTrainingJob",
                "name": JOB,
                "uid": "job-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "ps-training-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == JOB
        assert meta["labels"]["psoperator.io/job-name"] == JOB
        assert len(meta["annotations"][ANNOTATION_HASH]) == 16


@pytest.mark.parametrize("role,count", [("ps", 2), ("worker", 3)])
def test_tf_config_for_every_task(role: str, count: int) -> None:
    manifests = _by_kind(render_children(job(ps={"replicas": 2}, worker={"replicas": 3})))
    sts = manifests[("StatefulSet", f"ctr-{role}")]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert _env(container)["PSOP_TASK_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    for index in range(count):
        config = _kubelet_tf_config(container, index)
        assert config["task"] == {"type": role, "index": index}
        assert config["cluster"] == {
            "chief": [f"ctr-chief-0.ctr-chief.{NS}.svc.cluster.local:2222"],
            "ps": [f"ctr-ps-{i}.ctr-ps.{NS}.svc.cluster.local:2222" for i in range(2)],
            "worker": [f"ctr-worker-{i}.ctr-worker.{NS}.svc.cluster.local:2222" for i in range(3)],
        }


@pytest.mark.parametrize("role", ["ps", "worker"])
def test_a_changed_template_rolls_no_running_pod(role: str) -> None:
    sts = _by_kind(render_children(job()))[("StatefulSet", f"ctr-{role}")]
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_the_index_is_defined_before_tf_config_references_it() -> None:
    sts = _by_kind(render_children(job()))[("StatefulSet", "ctr-ps")]
    names = [e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.index("PSOP_TASK_INDEX") < names.index("TF_CONFIG")


def test_chief_job_has_stable_hostname_and_operator_owned_retries() -> None:
    chief = _by_kind(render_children(job(failurePolicy={"permanentExitCodes": [2, 1, 2]}), attempt=3))[
        ("Job", "ctr-chief")
    ]
    pod_spec = chief["spec"]["template"]["spec"]
    assert (pod_spec["hostname"], pod_spec["subdomain"]) == ("ctr-chief-0", "ctr-chief")
    assert pod_spec["restartPolicy"] == "Never"
    assert chief["spec"]["backoffLimit"] == 0
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [1, 2]},
    } in chief["spec"]["podFailurePolicy"]["rules"]
    assert chief["metadata"]["labels"][LABEL_ATTEMPT] == "3"
    assert chief["spec"]["template"]["metadata"]["labels"][LABEL_ATTEMPT] == "3"
    container = pod_spec["containers"][0]
    assert _kubelet_tf_config(container, 99)["task"] == {"type": "chief", "index": 0}
    assert {
        "name": "progress",
        "containerPort": contract.DEFAULT_PROGRESS_PORT,
        "protocol": "TCP",
    } in container["ports"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_evaluator_is_not_part_of_the_cluster() -> None:
    manifests = _by_kind(
        render_children(job(evaluator={"template": {"spec": {"containers": [{"name": "e"}]}}}))
    )
    evaluator = manifests[("Job", "ctr-evaluator")]
    config = json.loads(_env(evaluator["spec"]["template"]["spec"]["containers"][0])["TF_CONFIG"])
    assert config["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" not in config["cluster"]
    assert ("Service", "ctr-evaluator") in manifests


def test_services_are_headless_and_publish_unready_peers() -> None:
    service = _by_kind(render_children(job(port=3333)))[("Service", "ctr-ps")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"psoperator.io/job-name": JOB, "psoperator.io/role": "ps"}
    assert service["spec"]["ports"][0]["port"] == 3333


def test_checkpoint_volume_is_mounted_in_every_role() -> None:
    volume = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    manifests = render_children(job(checkpoint={"dir": "/ckpt", "volume": volume}))
    for manifest in manifests:
        if manifest["kind"] not in POD_OWNERS:
            continue
        pod_spec = manifest["spec"]["template"]["spec"]
        assert {"name": "psoperator-checkpoint", **volume} in pod_spec["volumes"]
        mounts = pod_spec["containers"][0]["volumeMounts"]
        assert {"name": "psoperator-checkpoint", "mountPath": "/ckpt"} in mounts
        assert _env(pod_spec["containers"][0])["PSOP_CHECKPOINT_DIR"] == "/ckpt"


def test_uri_checkpoint_gets_no_volume() -> None:
    sts = _by_kind(render_children(job(checkpoint={"dir": "gs://bucket/ckpt"})))[("StatefulSet", "ctr-ps")]
    assert "volumes" not in sts["spec"]["template"]["spec"]


S3_STORE: dict[str, Any] = {
    "endpoint": "http://store.storage.svc:8333",
    "region": "eu-west-1",
    "addressingStyle": "path",
    "credentialsSecret": {"name": "ctr-s3", "secretAccessKeyKey": "secret"},
}
S3_CHECKPOINT = {"dir": "s3://ctr-bucket/run-1", "s3": S3_STORE}


EVALUATOR = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}


def _pod_env_by_role(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        m["spec"]["template"]["metadata"]["labels"]["psoperator.io/role"]: _env(
            m["spec"]["template"]["spec"]["containers"][0]
        )
        for m in manifests
        if m["kind"] in POD_OWNERS
    }


def test_the_roles_that_touch_an_s3_checkpoint_get_the_store_and_the_secret_not_its_values() -> None:
    roles = _pod_env_by_role(render_children(job(checkpoint=S3_CHECKPOINT, evaluator=EVALUATOR)))
    touching = {"chief", "ps", "evaluator"}
    assert set(roles) == touching | {"worker"}
    for role in touching:
        env = roles[role]
        assert env["AWS_ENDPOINT_URL_S3"] == "http://store.storage.svc:8333"
        assert (env["AWS_REGION"], env["S3_ADDRESSING_STYLE"]) == ("eu-west-1", "path")
        assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "ctr-s3", "key": "AWS_ACCESS_KEY_ID"}}
        assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "ctr-s3", "key": "secret"}}
    assert not any(name.startswith(("AWS_", "S3_")) for name in roles["worker"])


def test_workers_get_the_store_when_they_read_data_from_it() -> None:
    checkpoint = {**S3_CHECKPOINT, "s3": {**S3_STORE, "shareWithWorkers": True}}
    worker = _pod_env_by_role(render_children(job(checkpoint=checkpoint)))["worker"]
    assert worker["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "ctr-s3", "key": "secret"}}


@pytest.mark.parametrize("key", ["accessKeyIdKey", "secretAccessKeyKey"])
def test_a_secret_key_the_api_server_refuses_in_an_env_var_is_refused_with_the_spec(key: str) -> None:
    # A secretKeyRef's key is letters, digits, "-", "_" and "."; another fails every pod template.
    secret = {"name": "store", key: "aws/id"}
    spec = job(checkpoint={"dir": "s3://ctr-bucket/run-1", "s3": {"credentialsSecret": secret}})["spec"]
    with pytest.raises(ValidationError, match=key):
        PSTrainingJobSpec.model_validate(spec)


def test_without_a_secret_the_pods_use_their_own_identity() -> None:
    checkpoint = {"dir": "s3://ctr-bucket/run-1", "s3": {"region": "eu-west-1"}}
    chief = _pod_env_by_role(render_children(job(checkpoint=checkpoint)))["chief"]
    assert {name: v for name, v in chief.items() if name.startswith(("AWS_", "S3_"))} == {
        "AWS_REGION": "eu-west-1"
    }


def test_the_operators_environment_and_port_names_win_over_a_stored_templates() -> None:
    """A template stored before the CRD refused them: the operator's values are used, each once."""
    main = {
        "name": "main",
        "image": "mine:2",
        "env": [
            {"name": "PSOP_PROGRESS_PORT", "value": "9999"},
            {"name": "TF_CONFIG", "value": "{}"},
            {"name": "DATA", "value": "/data"},
        ],
        "ports": [
            {"name": "tf", "containerPort": 9999},
            {"name": "progress", "containerPort": 9998},
            {"name": "web", "containerPort": 80},
        ],
    }
    sidecar = {"name": "sidecar", "ports": [{"name": "tf", "containerPort": 7777}]}
    template = {"spec": {"containers": [main, sidecar]}}
    chief = _by_kind(render_children(job(chief={"template": template})))[("Job", "ctr-chief")]
    main, sidecar = chief["spec"]["template"]["spec"]["containers"]
    assert main["image"] == "mine:2" and sidecar["image"] == "trainer:1"
    names = [e["name"] for e in main["env"]]
    assert len(names) == len(set(names)) and _env(main)["DATA"] == "/data"
    assert _env(main)["PSOP_PROGRESS_PORT"] == str(contract.DEFAULT_PROGRESS_PORT)
    assert json.loads(_env(main)["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"web": 80, "tf": 2222, "progress": contract.DEFAULT_PROGRESS_PORT}
    assert sidecar["ports"] == []


def test_the_environment_the_operator_sets_is_the_one_the_crd_keeps_for_it() -> None:
    """Every name contract_env and chief_env set, with each option that adds one, and no other."""
    interval = job(checkpoint={"dir": "/ckpt", "intervalSteps": 10, "intervalSeconds": 60})
    specs = [PSTrainingJobSpec.model_validate(obj["spec"]) for obj in (job(), interval)]
    injected = {
        e["name"]
        for spec in specs
        for tf_config in (None, "{}")
        for e in contract_env(spec, JOB, Role.PS, None, tf_config) + chief_env(spec)
    }
    assert injected == set(contract.INJECTED_ENV)


def test_suspended_and_stopped_jobs_run_no_pods() -> None:
    suspended = _by_kind(render_children(job(evaluator={"template": {}}), RenderOptions(suspended=True)))
    assert suspended[("StatefulSet", "ctr-ps")]["spec"]["replicas"] == 0
    assert ("Job", "ctr-chief") not in suspended  # a resume makes a new one (RenderOptions.suspended)
    assert suspended[("Job", "ctr-evaluator")]["spec"]["suspend"] is True
    stopped = _by_kind(render_children(job(), RenderOptions(stopped=True)))
    assert stopped[("StatefulSet", "ctr-worker")]["spec"]["replicas"] == 0
    assert stopped[("Job", "ctr-chief")]["spec"]["suspend"] is False


def test_pods_get_no_api_token_and_scheduling_settings() -> None:
    sts = _by_kind(
        render_children(job(scheduling={"schedulerName": "volcano", "priorityClassName": "high"}))
    )[("StatefulSet", "ctr-worker")]
    pod_spec = sts["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    assert (pod_spec["schedulerName"], pod_spec["priorityClassName"]) == ("volcano", "high")
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "ctr-worker"


def test_a_template_that_asks_for_an_api_token_gets_one() -> None:
    asks = {"template": {"spec": {"automountServiceAccountToken": True, "containers": [{"name": "t"}]}}}
    children = _by_kind(render_children(job(chief=asks)))
    chief = children[("Job", "ctr-chief")]["spec"]["template"]["spec"]
    assert chief["automountServiceAccountToken"] is True
    ps = children[("StatefulSet", "ctr-ps")]["spec"]["template"]["spec"]
    assert ps["automountServiceAccountToken"] is False


def test_cluster_domain_is_configurable() -> None:
    sts = _by_kind(render_children(job(), cluster_domain="corp.example"))[("StatefulSet", "ctr-ps")]
    config = _kubelet_tf_config(sts["spec"]["template"]["spec"]["containers"][0], 0)
    assert config["cluster"]["ps"][0] == f"ctr-ps-0.ctr-ps.{NS}.svc.corp.example:2222"


def test_every_pod_template_names_its_trainer_container() -> None:
    """Observing reads the trainer's status by this name: the kubelet sorts statuses by name."""
    for manifest in render_children(job(evaluator={"template": {"spec": {"containers": [{"name": "e"}]}}})):
        if manifest["kind"] not in POD_OWNERS:
            continue
        template = manifest["spec"]["template"]
        first = template["spec"]["containers"][0]["name"]
        assert template["metadata"]["annotations"][ANNOTATION_TRAINER_CONTAINER] == first


def _chief_with_sidecar_first(annotation: str) -> dict[str, Any]:
    template = {
        "metadata": {"annotations": {ANNOTATION_TRAINER_CONTAINER: annotation}},
        "spec": {"containers": [{"name": "linkerd-proxy"}, {"name": "main"}]},
    }
    chief: dict[str, Any] = _by_kind(render_children(job(chief={"template": template})))[("Job", "ctr-chief")]
    return chief


def test_the_template_may_name_its_trainer_container() -> None:
    chief = _chief_with_sidecar_first("main")
    template = chief["spec"]["template"]
    assert template["metadata"]["annotations"][ANNOTATION_TRAINER_CONTAINER] == "main"
    proxy, main = template["spec"]["containers"]
    assert {p["name"] for p in main["ports"]} == {"tf", "progress"} and "ports" not in proxy
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "terminationMessagePolicy" not in proxy
    # A sidecar's exit code never fails the job through the Job controller either.
    [fail_job] = [r for r in chief["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail_job["onExitCodes"]["containerName"] == "main"


def test_the_chiefs_trainer_alone_mounts_the_jobs_token_and_is_told_where() -> None:
    children = render_children(job(evaluator={"template": {"spec": {"containers": [{"name": "e"}]}}}))
    template = _chief_with_sidecar_first("main")["spec"]["template"]
    proxy, main = template["spec"]["containers"]
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == "psoperator-chief-token"]
    # Optional: a chief whose Secret the operator could not make still trains (answering nobody).
    assert volume["secret"] == {"secretName": "ctr-chief-token-job-uid", "optional": True}
    [mount] = main["volumeMounts"]
    path = _env(main)[contract.ENV_CHIEF_TOKEN_FILE]
    assert mount["readOnly"] and path == f"{mount['mountPath']}/token"
    assert "volumeMounts" not in proxy and contract.ENV_CHIEF_TOKEN_FILE not in _env(proxy)
    others = [m for m in children if m["kind"] in POD_OWNERS and m["metadata"]["name"] != "ctr-chief"]
    for manifest in others:
        pod = manifest["spec"]["template"]["spec"]
        assert "psoperator-chief-token" not in {v["name"] for v in pod.get("volumes", [])}
        assert all(contract.ENV_CHIEF_TOKEN_FILE not in _env(c) for c in pod["containers"])


def test_a_job_made_again_under_its_name_has_a_token_secret_of_its_own() -> None:
    """The Secret of a job just deleted may outlive it a moment: taken as the new job's, its chief
    would hold the old token and refuse the operator for good."""
    again = job()
    again["metadata"]["uid"] = "2b7e1516-28ae-d2a6-abf7-158809cf4f3c"
    secret = render_chief_token(again, "t" * 64)["metadata"]["name"]
    [volume] = [
        v for v in _chief(render_children(again))["spec"]["template"]["spec"]["volumes"] if "secret" in v
    ]
    assert secret == volume["secret"]["secretName"] == "ctr-chief-token-2b7e1516"
    assert secret != render_chief_token(job(), "t" * 64)["metadata"]["name"]


def test_a_token_file_the_template_names_is_the_operators() -> None:
    env = [{"name": contract.ENV_CHIEF_TOKEN_FILE, "value": "/dev/null"}]
    chief = _chief(
        render_children(job(chief={"template": {"spec": {"containers": [{"name": "t", "env": env}]}}}))
    )
    [container] = chief["spec"]["template"]["spec"]["containers"]
    assert (
        _env(container)[contract.ENV_CHIEF_TOKEN_FILE] == "/var/run/secrets/psoperator.io/chief-token/token"
    )


def test_the_token_secret_is_the_jobs_and_immutable() -> None:
    secret = render_chief_token(job(), "t" * 64)
    assert secret["metadata"]["name"] == "ctr-chief-token-job-uid" and secret["metadata"]["namespace"] == NS
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert secret["metadata"]["labels"]["psoperator.io/job-name"] == "ctr"
    assert secret["immutable"] is True and secret["stringData"] == {"token": "t" * 64}


def test_an_annotation_that_names_no_container_means_the_first() -> None:
    chief = _chief_with_sidecar_first("typo")
    template = chief["spec"]["template"]
    assert template["metadata"]["annotations"][ANNOTATION_TRAINER_CONTAINER] == "linkerd-proxy"


def _pod_failure_action(rules: list[dict[str, Any]], exit_code: int, conditions: list[str]) -> str:
    """What the Job controller does with a failed pod: the first rule that matches decides."""
    for rule in rules:
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions", [])
        if on_codes is not None and exit_code in on_codes["values"]:
            return str(rule["action"])
        if any(c["type"] in conditions and c["status"] == "True" for c in on_conditions):
            return str(rule["action"])
    return "Count"


@pytest.mark.parametrize(
    ("exit_code", "conditions", "action"),
    [
        # Evicted or preempted: SIGTERM may make user code exit 1, which is still no bug.
        (1, ["DisruptionTarget"], "Ignore"),
        (143, ["DisruptionTarget"], "Ignore"),
        (1, [], "FailJob"),
        (138, [], "Count"),
    ],
)
def test_disruptions_win_over_permanent_exit_codes(
    exit_code: int, conditions: list[str], action: str
) -> None:
    chief = _by_kind(render_children(job()))[("Job", "ctr-chief")]
    assert _pod_failure_action(chief["spec"]["podFailurePolicy"]["rules"], exit_code, conditions) == action


def _chief(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return _by_kind(manifests)[("Job", "ctr-chief")]


def test_a_jobs_hash_ignores_what_the_api_server_would_refuse_to_change() -> None:
    """A Job's template and podFailurePolicy are immutable: a change of them waits for the next Job."""
    before = _chief(render_children(job()))
    codes_changed = _chief(render_children(job(failurePolicy={"permanentExitCodes": [3]})))
    template_changed = _chief(
        render_children(job(chief={"template": {"spec": {"containers": [{"name": "x"}]}}}))
    )
    assert codes_changed["spec"]["podFailurePolicy"] != before["spec"]["podFailurePolicy"]
    hashes = {
        m["metadata"]["annotations"][ANNOTATION_HASH] for m in (before, codes_changed, template_changed)
    }
    assert len(hashes) == 1


def test_a_jobs_hash_follows_what_may_change() -> None:
    running = _chief(render_children(job()))
    stopped = _chief(render_children(job(), RenderOptions(chief_stopped=True)))
    assert (
        running["metadata"]["annotations"][ANNOTATION_HASH]
        != stopped["metadata"]["annotations"][ANNOTATION_HASH]
    )
    evaluator = {"template": {"spec": {"containers": [{"name": "e"}]}}}
    budget = [
        _by_kind(render_children(job(evaluator=evaluator, failurePolicy={"maxRestarts": n})))[
            ("Job", "ctr-evaluator")
        ]
        for n in (1, 2)
    ]
    assert (
        budget[0]["metadata"]["annotations"][ANNOTATION_HASH]
        != budget[1]["metadata"]["annotations"][ANNOTATION_HASH]
    )


def _big_job(ps: int, workers: int) -> dict[str, Any]:
    body = job()
    body["spec"]["ps"]["replicas"], body["spec"]["worker"]["replicas"] = ps, workers
    return body


def test_a_cluster_too_large_for_the_environment_goes_to_every_pod_in_a_config_map() -> None:
    """50 PS + 5,000 workers: TF_CONFIG inline would pass Linux's 128 KiB limit for one environment
    string, and be copied into every pod."""
    children = render_children(_big_job(50, 5000))
    config_map = children[0]  # first: the pods that mount it wait for it
    assert (config_map["kind"], config_map["metadata"]["name"]) == ("ConfigMap", f"{JOB}-tf-config")
    text = config_map["data"]["cluster.json"]
    env = {"PSOP_ROLE": "worker", "PSOP_TASK_INDEX": "4999"}
    cluster = json.loads(contract.tf_config_from_file(text, env))["cluster"]
    assert [len(cluster[r]) for r in ("chief", "ps", "worker")] == [1, 50, 5000]
    assert cluster["worker"][4999] == f"{JOB}-worker-4999.{JOB}-worker.team-a.svc.cluster.local:2222"
    assert len(json.dumps(cluster)) > 128 * 1024 > len(text)  # over the environment's limit; the file is not
    for child in children[1:]:
        if child["kind"] not in ("StatefulSet", "Job"):
            continue
        pod = child["spec"]["template"]["spec"]
        assert len(json.dumps(child)) < 16 * 1024, child["metadata"]["name"]
        assert {"name": "psoperator-tf-config", "configMap": {"name": f"{JOB}-tf-config"}} in pod["volumes"]
        for container in pod["containers"]:
            env = _env(container)
            assert "TF_CONFIG" not in env
            assert env["PSOP_TF_CONFIG_FILE"] == "/etc/psoperator/tf-config/cluster.json"
            assert {
                "name": "psoperator-tf-config",
                "mountPath": "/etc/psoperator/tf-config",
                "readOnly": True,
            } in (container["volumeMounts"])


def test_the_largest_job_the_crd_admits_fits_its_config_map_in_the_longest_namespace() -> None:
    """1,000 PS and 10,000 workers of a 40-character job in a 63-character namespace: 2 MB of
    addresses, which a ConfigMap (1 MiB at most) could not hold; its file is a few hundred bytes."""
    body = _big_job(MAX_REPLICAS, MAX_WORKERS)
    body["metadata"].update(name="j" * 40, namespace="n" * 63)
    [config_map] = [c for c in render_children(body) if c["kind"] == "ConfigMap"]
    text = config_map["data"]["cluster.json"]
    cluster = json.loads(contract.tf_config_from_file(text, {"PSOP_ROLE": "ps", "PSOP_TASK_INDEX": "0"}))
    assert [len(cluster["cluster"][r]) for r in ("chief", "ps", "worker")] == [1, MAX_REPLICAS, MAX_WORKERS]
    assert len(json.dumps(cluster)) > 1024 * 1024 > 512 > len(text)  # over a ConfigMap's limit; the file not


def test_a_file_that_is_no_cluster_file_is_refused() -> None:
    env = {"PSOP_ROLE": "ps", "PSOP_TASK_INDEX": "0"}
    for text in ("[]", '{"cluster": {"ps": ["a:1"]}}', '{"address": "x:1", "tasks": {"ps": 1}}',
                 '{"address": "x-{index}:1", "tasks": {"ps": -1}}'):  # fmt: skip
        with pytest.raises(ValueError):
            contract.tf_config_from_file(text, env)


def test_the_runtime_composes_from_the_file_the_tf_config_the_environment_would_have_held() -> None:
    small = _by_kind(render_children(_big_job(2, 300)))
    large = _by_kind(render_children(_big_job(2, 1000)))
    assert ("ConfigMap", f"{JOB}-tf-config") not in small
    cluster_text = large[("ConfigMap", f"{JOB}-tf-config")]["data"]["cluster.json"]
    for index in (0, 999):
        env = {"PSOP_ROLE": "worker", "PSOP_TASK_INDEX": str(index), "PSOP_POD_NAME": f"{JOB}-worker-{index}"}
        from_file = json.loads(contract.tf_config_from_file(cluster_text, env))
        inline = json.loads(
            _env(small[("StatefulSet", f"{JOB}-worker")]["spec"]["template"]["spec"]["containers"][0])[
                "TF_CONFIG"
            ].replace("$(PSOP_TASK_INDEX)", str(index))
        )
        assert from_file["task"] == inline["task"] == {"type": "worker", "index": index}
        assert from_file["cluster"]["worker"][:300] == inline["cluster"]["worker"]
    # Before Kubernetes 1.28 the index is empty; the pod's ordinal stands in, as for the environment.
    env = {"PSOP_ROLE": "ps", "PSOP_TASK_INDEX": "", "PSOP_POD_NAME": f"{JOB}-ps-1"}
    assert json.loads(contract.tf_config_from_file(cluster_text, env))["task"] == {"type": "ps", "index": 1}

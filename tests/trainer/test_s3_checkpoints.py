"""Checkpoints in a bucket, with real TensorFlow processes: a job whose spec.checkpoint.dir is
s3://, its pods' environment rendered by the operator (the Secret's keys resolved as the kubelet
would), against SeaweedFS's S3 gateway in a namespace of the job's private network.

Each parameter server writes the shards of its variables to the bucket itself: its own requests
(S3_LOG_REQUESTS) carry the data, not the chief's.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from s3plugin import build_plugin
from test_training import STARTUP_SECONDS, measure, progress_where
from tfcluster.jobs import ctr_job
from tfcluster.launcher import LocalCluster, Process, wait_exit
from tfcluster.netns import PrivateNetwork
from tfcluster.objectstore import ACCESS_KEY, S3_PORT, SECRET_KEY, start_store

from psoperator.contract import ExitCode

pytestmark = pytest.mark.tensorflow

BUCKET = "ctr-checkpoints"
SECRET = "ctr-s3"
STORE_HOST = "store"


def s3_job(
    run: str, chief_args: list[str], *, secret: str = SECRET, endpoint: str = "", **kw: Any
) -> dict[str, Any]:
    """The tests' job with its checkpoints in the bucket: spec.checkpoint.s3 names the store and
    the Secret; every role's template points at the plugin built for this interpreter."""
    job: dict[str, Any] = ctr_job(Path("/unused"), chief_args, **kw)
    job["spec"]["checkpoint"] |= {
        "dir": f"s3://{BUCKET}/{run}",
        "s3": {
            "endpoint": endpoint or f"http://{STORE_HOST}:{S3_PORT}",
            "addressingStyle": "path",
            "credentialsSecret": {"name": secret},
        },
    }
    for role in ("chief", "ps", "worker", "evaluator"):
        container = job["spec"][role]["template"]["spec"]["containers"][0]
        container.setdefault("env", []).extend(
            [
                {"name": "PSTRAINER_S3_PLUGIN", "value": str(build_plugin())},
                {"name": "S3_LOG_REQUESTS", "value": "1"},
            ]
        )
    return job


SECRETS = {
    SECRET: {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    "wrong": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": "not-the-secret"},
}


@pytest.fixture(scope="module")
def s3_cluster(
    networks: Callable[[str], PrivateNetwork], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """ps-0, ps-1, worker-0, worker-1 of an s3:// job running, and the store."""
    build_plugin()
    network = networks("s3")
    workdir = tmp_path_factory.mktemp("s3-cluster")
    store_host = network.add_host(STORE_HOST, [STORE_HOST])
    local = LocalCluster(s3_job("unused", ["--steps=1"]), workdir, network, secret_data=SECRETS)
    prefix = ["ip", "netns", "exec", store_host.netns]
    with (workdir / "weed.log").open("wb") as log:
        store, _ = start_store(
            workdir, store_host.ip, BUCKET, log, prefix=prefix, answers=_in(network), bind="0.0.0.0"
        )
        try:
            local.ensure_servers()
            yield local
        finally:
            local.stop_all()
            store.terminate()
            store.wait(30)


def _in(network: PrivateNetwork) -> Callable[[str, int], bool]:
    """Whether a port of the store answers, asked from inside the store's namespace."""

    def answers(ip: str, port: int) -> bool:
        try:
            status, _ = network.http_get(STORE_HOST, port, "/")
        except OSError:
            return False
        return int(status) > 0

    return answers


def shard_uploads(process: Process, run: str) -> set[str]:
    """The checkpoint shards whose data a process uploaded: `ckpt-N.part-I-of-M` (TensorFlow's
    name for a shard of an s3:// checkpoint before the chief merges them)."""
    pattern = rf"s3: PUT s3://{BUCKET}/{run}/(ckpt-\d+\.part-\d+-of-\d+)\.data-\S+ -> 200, (\d+) bytes sent"
    return {m.group(1) for m in re.finditer(pattern, process.log()) if int(m.group(2)) > 0}


def test_a_job_checkpoints_to_the_bucket_each_ps_its_own_shards_and_resumes_after_a_lost_ps(
    s3_cluster: LocalCluster,
) -> None:
    cluster = s3_cluster
    cluster.ensure_servers()
    total, interval = 600, 100
    job = s3_job("resume", [f"--steps={total}"], interval_steps=interval)
    chief = cluster.start_chief(job)
    report = progress_where(
        cluster, chief, "a checkpoint at step 200 or later", lambda r: (r.checkpoint_step or 0) >= 200
    )
    assert report.checkpoint_path is not None and report.checkpoint_path.startswith(
        f"s3://{BUCKET}/resume/ckpt-"
    )
    # The chief writes the shard of its own variable (the global step), each PS those of its own.
    written = {key: shard_uploads(cluster.processes[key], "resume") for key in ("chief-0", "ps-0", "ps-1")}
    assert all(written.values()), written
    assert not (written["chief-0"] & (written["ps-0"] | written["ps-1"])), written

    ps = cluster.processes["ps-1"]
    ps.signal(signal.SIGKILL)
    wait_exit(ps, 10)
    assert wait_exit(chief, 60) == ExitCode.RETRYABLE, chief.log()[-4000:]
    failed = chief.termination_message()
    assert failed is not None and failed.checkpoint_step is not None

    cluster.start("ps-1")
    began = time.monotonic()
    resumed_chief = cluster.start_chief(job, attempt=1)
    resumed = progress_where(
        cluster, resumed_chief, "the resumed step", lambda r: r.resumed_from_step is not None
    )
    measure("s3_restore_to_first_report", time.monotonic() - began, "s")
    assert resumed.resumed_from_step == failed.checkpoint_step
    assert wait_exit(resumed_chief, 300) == ExitCode.SUCCEEDED, resumed_chief.log()[-4000:]
    final = resumed_chief.termination_message()
    assert final is not None and (final.step, final.checkpoint_path) == (
        total,
        f"s3://{BUCKET}/resume/ckpt-{total}",
    )
    saves = [
        float(s) for s in re.findall(r"checkpoint at step \d+: \S+ \(([0-9.]+) s\)", resumed_chief.log())
    ]
    measure("s3_checkpoint_save_median", sorted(saves)[len(saves) // 2], "s")


@pytest.mark.parametrize(
    ("case", "change", "said"),
    [
        ("a missing bucket", {"dir": "s3://no-such-bucket/run"}, "bucket no-such-bucket does not exist"),
        ("a wrong secret", {"secret": "wrong"}, "SignatureDoesNotMatch"),
        ("no store there", {"endpoint": f"http://{STORE_HOST}:9"}, "no answer"),
    ],
)
def test_storage_that_is_not_there_ends_the_chief_with_the_configuration_code(
    s3_cluster: LocalCluster, case: str, change: dict[str, str], said: str
) -> None:
    job = s3_job(
        "bad", ["--steps=100"], secret=change.get("secret", SECRET), endpoint=change.get("endpoint", "")
    )
    if "dir" in change:
        job["spec"]["checkpoint"]["dir"] = change["dir"]
    chief = s3_cluster.start_chief(job)
    assert wait_exit(chief, STARTUP_SECONDS) == ExitCode.BAD_CONFIG, chief.log()[-4000:]
    report = chief.termination_message()
    assert report is not None and report.message is not None, case
    assert "checkpoint storage s3://" in report.message and said in report.message, report.message
    assert SECRET_KEY not in chief.log() and "not-the-secret" not in chief.log()
    assert "cluster connected" not in chief.log()

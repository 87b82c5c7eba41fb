"""The s3:// filesystem plugin inside TensorFlow, against SeaweedFS's S3 gateway on loopback: what
TensorFlow's file API and its CheckpointManager need of it, and the errors of storage that is not
there. The multi-process checkpoints (each parameter server writing its own shards) are in
test_s3_checkpoints.py.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3plugin import build_plugin
from tfcluster.objectstore import Store, start_store

pytestmark = pytest.mark.tensorflow

BUCKET = "plugin-tests"
PART = 5 << 20  # the smallest part S3 allows: a few MiB make a multipart upload


def _free_ip() -> str:
    """A loopback address of its own (127.x.y.z), so that the store's fixed ports collide with no
    other process on the machine."""
    for last in range(2, 250):
        ip = f"127.0.83.{last}"
        with socket.socket() as probe:
            try:
                probe.bind((ip, 8333))
                return ip
            except OSError:
                continue
    raise RuntimeError("no free loopback address")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    workdir = tmp_path_factory.mktemp("store")
    with (workdir / "weed.log").open("wb") as log:
        process, found = start_store(workdir, _free_ip(), BUCKET, log)
        try:
            yield found
        finally:
            process.terminate()
            process.wait(30)


@pytest.fixture(scope="module")
def tf(store: Store) -> Any:
    """TensorFlow with the plugin registered, configured for the store (it reads its environment
    once, when registered); parts of 5 MiB and copies in parts above 8 MiB."""
    plugin = build_plugin()
    os.environ.update(store.env(), S3_PART_SIZE_BYTES=str(PART), S3_SINGLE_COPY_LIMIT_BYTES=str(8 << 20))
    import tensorflow

    tensorflow.experimental.register_filesystem_plugin(str(plugin))
    return tensorflow


def url(path: str) -> str:
    return f"s3://{BUCKET}/{path}"


def test_a_file_appears_whole_when_closed_and_reads_back(tf: Any) -> None:
    data = os.urandom(2 * PART + 12345)  # three parts
    with tf.io.gfile.GFile(url("whole/blob"), "wb") as file:
        file.write(data[:PART])
        file.write(data[PART:])
        assert not tf.io.gfile.exists(url("whole/blob"))
    assert tf.io.gfile.stat(url("whole/blob")).length == len(data)
    with tf.io.gfile.GFile(url("whole/blob"), "rb") as file:
        assert file.read() == data
        file.seek(PART - 3)
        assert file.read(6) == data[PART - 3 : PART + 3]


def test_directories_are_prefixes(tf: Any) -> None:
    tf.io.gfile.makedirs(url("tree/a/b"))
    assert tf.io.gfile.isdir(url("tree/a/b")) and tf.io.gfile.isdir(url("tree/a"))
    with tf.io.gfile.GFile(url("tree/a/file"), "w") as file:
        file.write("x")
    assert sorted(tf.io.gfile.listdir(url("tree/a"))) == ["b", "file"]
    assert not tf.io.gfile.isdir(url("tree/a/file"))
    assert not tf.io.gfile.exists(url("tree/missing"))
    assert tf.io.gfile.glob(url("tree/a/f*")) == [url("tree/a/file")]
    with pytest.raises(tf.errors.NotFoundError):
        tf.io.gfile.listdir(url("tree/missing"))
    tf.io.gfile.rmtree(url("tree"))
    assert not tf.io.gfile.exists(url("tree/a"))


def test_a_rename_copies_on_the_server_and_removes_the_source(tf: Any) -> None:
    data = os.urandom(2 * PART)  # above the single-copy limit: copied in parts
    with tf.io.gfile.GFile(url("moves/from"), "wb") as file:
        file.write(data)
    tf.io.gfile.rename(url("moves/from"), url("moves/to"), overwrite=True)
    assert not tf.io.gfile.exists(url("moves/from"))
    with tf.io.gfile.GFile(url("moves/to"), "rb") as file:
        assert file.read() == data


def test_the_checkpoint_manager_finds_the_latest_and_prunes_in_the_bucket(tf: Any) -> None:
    variable = tf.Variable(tf.zeros([1000, 300]))  # 1.2 MB
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), url("manager"), max_to_keep=2)
    for step in (1, 2, 3):
        variable.assign(tf.fill([1000, 300], float(step)))
        manager.save(checkpoint_number=step)
    names = tf.io.gfile.listdir(url("manager"))
    assert tf.train.latest_checkpoint(url("manager")) == url("manager/ckpt-3")
    assert not [n for n in names if n.startswith("ckpt-1")], names
    assert {"ckpt-2.index", "ckpt-3.index", "checkpoint"} <= set(names)
    restored = tf.Variable(tf.zeros([1000, 300]))
    tf.train.Checkpoint(v=restored).restore(url("manager/ckpt-2")).assert_consumed()
    assert float(restored[0, 0]) == 2.0


def test_a_writer_killed_before_close_leaves_no_object(tf: Any, store: Store, tmp_path: Path) -> None:
    """What makes a half-written checkpoint unrestorable: TensorFlow writes a checkpoint's index and
    then its `checkpoint` file after its data, and none of them exists until written whole."""
    script = (
        "import os, sys, tensorflow as tf\n"
        "tf.experimental.register_filesystem_plugin(sys.argv[1])\n"
        "f = tf.io.gfile.GFile(sys.argv[2], 'wb')\n"
        f"f.write(b'x' * {2 * PART})\n"  # one part uploaded, the rest buffered
        "os._exit(9)\n"
    )
    env = {**os.environ, "S3_PART_SIZE_BYTES": str(PART)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(build_plugin()), url("killed/blob")],
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 9, done.stderr[-3000:]
    assert not tf.io.gfile.exists(url("killed/blob"))


def test_a_missing_bucket_is_a_configuration_error_naming_it(tf: Any) -> None:
    """The chief's check; a wrong secret and a store that does not answer are in
    test_s3_checkpoints.py, as the chief meets them (the plugin reads its settings once)."""
    from pstrainer.config import ConfigError
    from pstrainer.storage import check_checkpoint_storage

    with pytest.raises(ConfigError) as refused:
        check_checkpoint_storage("s3://no-such-bucket/run")
    assert "checkpoint storage s3://no-such-bucket/run is not usable" in str(refused.value)
    assert "bucket no-such-bucket does not exist" in str(refused.value)


def test_the_check_changes_nothing_in_a_directory_that_holds_checkpoints(tf: Any) -> None:
    from pstrainer.storage import check_checkpoint_storage

    with tf.io.gfile.GFile(url("kept/checkpoint"), "w") as file:
        file.write('model_checkpoint_path: "ckpt-7"\n')
    check_checkpoint_storage(url("kept"))
    assert tf.io.gfile.listdir(url("kept")) == ["checkpoint"]


def test_without_the_plugin_an_s3_checkpoint_dir_is_a_configuration_error(tf: Any) -> None:
    from pstrainer.config import ConfigError
    from pstrainer.storage import register_filesystems

    missing = {"PSTRAINER_S3_PLUGIN": "/nonexistent/libpstrainer_s3.so"}
    with pytest.raises(
        ConfigError, match=re.escape("s3:// filesystem plugin /nonexistent/libpstrainer_s3.so cannot be")
    ):
        register_filesystems(missing, "s3://bucket/run")
    register_filesystems(missing, "/checkpoints")  # a path needs no plugin: a warning only

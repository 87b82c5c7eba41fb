"""The s3:// filesystem plugin (images/trainer/s3fs), built for this interpreter's TensorFlow into
the cache, as the trainer image builds it into its package."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from tfcluster.objectstore import CACHE

SOURCES = Path(__file__).resolve().parents[2] / "images" / "trainer" / "s3fs"
PLUGIN: Path = CACHE / "s3fs" / "libpstrainer_s3.so"


@functools.cache
def build_plugin() -> Path:
    """make, once per test process: rebuilt only when a source is newer than the library."""
    subprocess.run(
        ["make", "-s", "-C", str(SOURCES), f"PYTHON={sys.executable}", f"OUT={PLUGIN.parent}"],
        check=True,
        timeout=900,
    )
    return PLUGIN

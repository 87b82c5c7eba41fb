"""Where the repository is and where the built binaries, images and clusters are cached. Standard
library only: e2e/demo.sh's manifests (e2e.real.example) need nothing beyond the base package."""

from __future__ import annotations

import os
from pathlib import Path

# The root of the repository these tests are in.
REPO = Path(__file__).resolve().parent.parent
# The binaries, images and clusters of e2e/cluster/*.sh and images/build.sh (their CACHE).
CACHE = Path(os.environ.get("PSOPERATOR_CACHE", Path.home() / ".cache" / "psoperator"))

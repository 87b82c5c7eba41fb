"""Five coordinated restarts in a row leave every parameter server holding one copy of the model.

The restarts are done as the operator does them (policies/ps_recycle.py): the parameter servers
restart with the chief, and each chief resumes from the previous one's checkpoint. Without that,
each chief adds a copy of the model to every PS (`python tests/trainer/tfcluster/ps_memory.py`
measures both ways). The figures are printed as MEASURE lines (`pytest -s`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from tfcluster.launcher import LocalCluster
from tfcluster.ps_memory import CHECKPOINT_STEPS, MiB, planned, restart_chiefs

pytestmark = pytest.mark.tensorflow

RESTARTS = 5
# After the first restart (the first PS that restored the model), how much more a PS may hold.
BOUND = 1.10


def test_ps_memory_stays_flat_over_five_restarts_and_within_the_plan(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    rounds = restart_chiefs(cluster, tmp_path / "ckpt", RESTARTS + 1)
    for one in rounds:
        print(f"MEASURE {one.line()}")

    # Each chief resumed from the latest checkpoint of the one before it: the one seen, or a later
    # one written before the SIGKILL landed.
    assert rounds[0].resumed_from is None
    for before, after in itertools.pairwise(rounds):
        assert after.resumed_from is not None and after.resumed_from >= before.checkpoint_step, (
            before,
            after,
        )
        assert after.resumed_from % CHECKPOINT_STEPS == 0, after

    need_mib = planned().per_ps_bytes / MiB
    first = rounds[1].rss_mib
    for one in rounds[1:]:
        for key in ("ps-0", "ps-1"):
            assert one.rss_mib[key] <= BOUND * first[key], (key, first, one)
            # The planner sizes for what a PS holds after a restore, with its headroom.
            assert one.rss_mib[key] <= need_mib, (key, one, need_mib)
    held = max(one.rss_mib[k] for one in rounds for k in ("ps-0", "ps-1"))
    print(f"MEASURE ps_rss_max={held:.0f} MiB planner_per_ps={need_mib:.0f} MiB ratio={held / need_mib:.2f}")

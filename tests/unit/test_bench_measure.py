"""The benchmark's arithmetic (e2e/bench/measure.py)."""

from __future__ import annotations

from e2e.bench.measure import most_in_a_minute


def test_the_most_in_a_minute_is_the_largest_rise_between_samples_at_most_60_s_apart() -> None:
    samples = [(0.0, 0.0), (30.0, 10.0), (60.0, 40.0), (65.0, 41.0), (125.0, 100.0), (200.0, 100.0)]
    # 60 -> 125 s rose 60 but is 65 s apart; 65 -> 125 s rose 59 within 60 s
    assert most_in_a_minute(samples) == 59.0
    assert most_in_a_minute([(0.0, 3.0)]) == 0.0

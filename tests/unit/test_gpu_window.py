"""The busiest figures of each GPU over a window of change-driven samples."""

from __future__ import annotations

from schedd.gpu_window import GpuWindow


def test_the_peak_counts_the_samples_inside_the_window_and_the_one_that_held_into_it() -> None:
    w = GpuWindow(window_s=60.0)
    w.add("g", 0.0, 90, 30_000)  # busy at first
    w.add("g", 50.0, 10, 2_000)  # then nearly idle
    assert w.peak("g", 55.0) == (90, 30_000)
    # At 100 s the window starts at 40 s: the busy sample was replaced at 50 s, inside
    # it, so it still counts until 110 s.
    assert w.peak("g", 100.0) == (90, 30_000)
    assert w.peak("g", 111.0) == (10, 2_000)  # the idle figure held since 50 s
    assert w.peak("other", 111.0) == (0, 0)


def test_old_samples_are_dropped_but_the_one_holding_into_the_window_is_kept() -> None:
    w = GpuWindow(window_s=10.0)
    for t in range(100):
        w.add("g", float(t), t % 7 * 10, 0)
    assert len(w._samples["g"]) <= 12
    assert w.peak("g", 99.0) == (60, 0)

"""A run's wall time, split at the moments the runner passes."""

import pytest

from serving_study.measure.run_timeline import PHASES, RunTimeline


def test_the_phases_run_end_to_end_from_the_lock_to_the_written_files():
    timeline = RunTimeline()
    timeline.moments = {
        "lock_taken": 100.0,
        "launched": 100.2,
        "healthy": 131.7,
        "stop_started": 150.0,
        "stopped": 153.5,
        "written": 153.6,
    }
    timeline.add_client(
        {"t0_epoch": 132.0, "measured_start_s": 1.5, "measured_end_s": 17.5}
    )
    phases = timeline.phases()
    assert list(phases) == list(PHASES)
    assert phases == {
        "before_launch": pytest.approx(0.2),
        "server_start": pytest.approx(31.5),
        "after_healthy": pytest.approx(0.3),
        "client_warmup": pytest.approx(1.5),
        "measured_window": pytest.approx(16.0),
        "after_window": pytest.approx(0.5),
        "server_stop": pytest.approx(3.5),
        "writing": pytest.approx(0.1),
    }
    assert sum(phases.values()) == pytest.approx(153.6 - 100.0)


def test_a_run_that_ended_early_has_no_figure_for_what_it_never_reached():
    timeline = RunTimeline()
    timeline.note("lock_taken")
    timeline.note("launched")
    phases = timeline.phases()
    assert phases["before_launch"] is not None
    assert phases["server_start"] is None and phases["measured_window"] is None

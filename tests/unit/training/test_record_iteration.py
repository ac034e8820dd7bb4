"""``tel.record_iteration``: a step a library reports only as durations after it ended, written as any other."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import otel_rl
from otel_rl.readers.analysis import analyze


def test_steps_measured_elsewhere_read_as_iterations_and_bad_timestamps_are_clear_errors(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0, quiet=True)
    with tel.run():
        now = time.perf_counter_ns()
        for i in range(10):  # numpy values too, as a library hands them
            start = np.int64(now + i * 10_000_000)
            tel.record_iteration(np.int64(i), start, start + 10_000_000, [("generation", start, start + 6_000_000), ("learning", start + 6_000_000, start + 9_000_000)],
                                 env_steps=np.int64(8 * i))  # fmt: skip
        with pytest.raises(ValueError, match="start_ns must be an integer of nanoseconds"):
            tel.record_iteration(10, "soon", now)
        with pytest.raises(ValueError, match="outside the 64-bit range"):
            tel.record_iteration(10, now, 10**30)
        with pytest.raises(ValueError, match="does not lie in iteration 10"):
            tel.record_iteration(10, now, now + 10, [("learning", now, now + 20)])
        wall = time.time_ns()  # the wrong clock: decades ahead of perf_counter_ns()
        with pytest.raises(ValueError, match=r"ahead of time.perf_counter_ns\(\) \(stamped with time.time_ns\(\)\?\)"):
            tel.record_iteration(10, wall, wall + 10)
        with pytest.raises(ValueError, match=r"phases\[1\] must be \(name, start_ns, end_ns\), got"):
            tel.record_iteration(10, now, now + 10, [("learning", now, now + 5), ("generation", now)])
        with pytest.raises(ValueError, match="index must be an integer from 0, got -5"):
            tel.record_iteration(-5, now, now + 10)
        with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.iteration(11):  # inside an open iteration: said, nothing recorded
            tel.record_iteration(12, now, now + 10)
        assert "inside an open learner iteration" in caplog.text
    tel.close()
    learner = analyze(tmp_path).timelines["learner"]
    assert learner.cycles == 11  # the ten rebuilt ones and the one entered
    assert learner.phases["generation"].mean_ms == pytest.approx(6.0) and learner.phases["learning"].count == 10

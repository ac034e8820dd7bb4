"""Loops whose bottleneck is known by construction: every surface names the truth, and they name the same side.

Each loop runs with the second core idle and busy (a process spinning on it). The live verdict's last word (what the
panel, the page and the trackers show), the trace's headline (``otel-rl analyze``) and ``otel_rl.read.runs`` must
name the side that sets the steady state's pace; on a steady loop the live verdict never changes; after a real
change of regime it follows within a bounded number of iterations. ``pytest -s`` prints each loop's row of the
agreement table.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from verdict_corpus import CHANGE_AT, LOOPS, surfaces, table

from otel_rl.core.live_verdict import CHANGE_CYCLES, MAX_WINDOW_S

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out

@pytest.fixture(params=["idle", "busy"])
def host(request):
    if request.param == "idle":
        yield "idle"
        return
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield "busy"
    finally:
        spinning.kill()
        spinning.wait()


@pytest.mark.parametrize("loop", LOOPS, ids=[loop.name for loop in LOOPS])
def test_every_surface_names_the_truth(tmp_path, loop, host):
    found = {**surfaces(loop, tmp_path / "run"), "host": host}
    print("\n" + table([found]))
    assert found["live"] == found["trace"] == found["read"] == loop.truth, found
    if loop.change_at is None and loop.name != "warm-up then steady":
        assert found["changes"] == 0, found  # steady: said once, never flipped
    if loop.change_at is not None:
        (iteration,) = found["change_iterations"]
        # Followed once the window turned and the new verdict held: within the longest window's iterations at this pace.
        assert CHANGE_AT <= iteration <= CHANGE_AT + CHANGE_CYCLES + int(MAX_WINDOW_S / 0.016), found


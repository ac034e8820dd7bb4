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
    if loop.phase is not None:
        assert set(found["phases"]) == {loop.phase}, found
    if loop.change_at is None and loop.name != "warm-up then steady":
        assert found["changes"] == 0, found  # steady: said once, never flipped
    if loop.change_at is not None:
        (iteration,) = found["change_iterations"]
        # Followed once the window turned and the new verdict held: within the longest window's iterations at this pace.
        assert CHANGE_AT <= iteration <= CHANGE_AT + CHANGE_CYCLES + int(MAX_WINDOW_S / 0.016), found



def test_a_folder_and_the_service_it_sent_its_trace_to_give_one_verdict(tmp_path):
    """Learner-bound for 5 s, then collector-bound for its last 2.5 s: the live verdict's last word is the tail's, the
    trace's headline the steady state's. Once the trace's diagnosis reached the service, read.runs says the same of the
    folder as of the service (the folder gave the live verdict, the service the trace's)."""
    import otel_rl
    import otel_rl.read
    from verdict_corpus import Loop, run

    from otel_rl.readers.server import IngestServer

    tail = Loop("tail", "learner", 7.5, lambda i, t: (0.0, 0.015, 0.003) if t > 5.0 else (0.0, 0.001, 0.015))
    with IngestServer(str(tmp_path / "runs.sqlite3")) as server:
        run(tail, tmp_path / "tail", motrix_url=server.url, upload_wait_s=120)
        (served,) = otel_rl.read.runs(server.url).to_dict("records")
    (folder,) = otel_rl.read.runs(tmp_path / "tail").to_dict("records")
    assert served["bottleneck_side"] == "learner", served["bottleneck"]  # the trace's: its steady state
    assert (folder["bottleneck"], folder["bottleneck_side"], folder["bottleneck_phase"]) == (
        served["bottleneck"], served["bottleneck_side"], served["bottleneck_phase"]
    )

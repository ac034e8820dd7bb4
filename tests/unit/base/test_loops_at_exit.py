"""A background loop still inside a library's native code when the process exits must not take the process down.

Python before 3.14 ends a daemon thread that wakes during finalization with ``pthread_exit``; under a Rust frame
(pydantic-core, which SwanLab's and W&B's ``init`` run) that aborts or crashes the process after training is done
(a thread-host run's SwanLab thread did: "FATAL: exception not rethrown", exit status 134). Loops marked
``stop_at_exit`` (every tracker's writer) are stopped before that. Real pydantic, real interpreter exits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pydantic")

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import pydantic
    from otel_rl.base.loops import BackgroundLoop

    class Settings(pydantic.BaseModel):  # a tracker's settings, validated by pydantic-core (Rust) calling Python
        value: int

        @pydantic.field_validator("value")
        @classmethod
        def check(cls, v):
            return v + 1

    class Busy(BackgroundLoop):
        stop_at_exit = sys.argv[1] == "stop"
        released = False

        def run_once(self):
            while True:  # an SDK's init that outlives the close deadline
                Settings(value=1)

        def release(self):
            print("released", flush=True)  # a stopped loop runs no more of the library's code

    loops = [Busy(f"otel-rl-busy-{k}", 0.01) for k in range(8)]
    for loop in loops:
        loop.start()
        loop.wake()
    time.sleep(0.3)
    print("exiting", flush=True)
    """
)


def _exit_status(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)


def test_loops_inside_native_code_at_exit_are_stopped_and_the_process_exits_cleanly():
    for _ in range(3):
        done = _exit_status("stop")
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert done.stdout.splitlines() == ["exiting"], done.stdout  # no release() after the stop
        assert "Traceback" not in done.stderr and "FATAL" not in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="Python 3.14 leaves such threads hanging rather than ending them")
def test_the_same_loops_left_running_take_the_process_down():
    """The hazard is real: without the stop, the same exits abort or crash (status 134 or 139)."""
    statuses = [_exit_status("keep").returncode for _ in range(3)]
    assert any(status in (-6, -11, 134, 139) for status in statuses), statuses

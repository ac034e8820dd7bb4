"""The live panel as a user sees it: on by default in a real terminal (a pseudo-terminal), off with OTEL_RL_PANEL=0 or off a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

LOOP = """
import sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    for i in range(150):
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                time.sleep(0.02)
        tel.scalars({"Loss/critic": 1.0 / (i + 1), "Train/mean_reward": -100.0 + i})
tel.close()
print("otel-rl-test: done", flush=True)
"""


UNTIL_SEEN = """
import os, sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    i, began = 0, time.monotonic()
    while not os.path.exists(sys.argv[2]) and time.monotonic() - began < 60:  # the terminal is read for 90 s
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                time.sleep(0.02)
        i += 1
    print("otel-rl-test: the loop ended", flush=True)
tel.close()
print("otel-rl-test: done", flush=True)
"""


def in_terminal(tmp_path, env: dict, loop: str = LOOP, seen: bytes | tuple[bytes, ...] | None = None) -> str:
    """What the loop wrote to a pseudo-terminal of 140 columns, as a person's terminal shows it.

    ``seen``: the loop (:data:`UNTIL_SEEN`) goes on until the terminal has shown it (the file ``sys.argv[2]``
    appears); several: the k-th makes ``sys.argv[2]`` followed by k appear (the first, ``sys.argv[2]`` itself).
    """
    markers = (seen,) if isinstance(seen, bytes) else tuple(seen or ())
    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    stop = tmp_path / "seen"
    process = subprocess.Popen([sys.executable, "-c", loop, str(tmp_path / "run"), str(stop)], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                out += os.read(leader, 1 << 16)
            except OSError:  # the terminal closed with the process
                break
            for k, marker in enumerate(markers):
                if marker in out:
                    (tmp_path / f"seen{k or ''}").touch()
        elif process.poll() is not None and b"otel-rl-test: done" in out:
            break
    process.wait(timeout=30)
    os.close(leader)
    return out.decode("utf-8", "replace")


def environment(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update({"TERM": "xterm-256color", "COLUMNS": "140", "LINES": "50", **extra})
    return env


def test_the_panel_is_on_by_default_in_a_terminal(tmp_path):
    screen = in_terminal(tmp_path, environment())
    assert "otel-rl-test: done" in screen
    assert "╭─ otel-rl" in screen and "Loss/critic" in screen and "Learning" in screen, screen[-3000:]


def test_the_panel_is_off_with_otel_rl_panel_0_and_off_a_terminal(tmp_path):
    screen = in_terminal(tmp_path / "off", environment(OTEL_RL_PANEL="0"))
    assert "otel-rl-test: done" in screen and "╭─ otel-rl" not in screen
    piped = subprocess.run([sys.executable, "-c", LOOP, str(tmp_path / "piped")], capture_output=True, text=True, timeout=120, env=environment())
    assert piped.returncode == 0 and "╭─ otel-rl" not in piped.stdout + piped.stderr
    assert "Avg" not in piped.stdout  # no plain panel lines by default in a log file either


def test_a_dumb_terminal_gets_plain_lines_while_the_run_goes_on(tmp_path):
    """TERM=dumb (an Emacs shell, some CI consoles) cannot redraw: a plain line every few seconds, not one frame at the end."""
    screen = in_terminal(tmp_path, environment(TERM="dumb"), UNTIL_SEEN, seen=b"otel-rl run | ")
    assert "otel-rl-test: done" in screen and "╭─ otel-rl" not in screen
    assert "\x1b[" not in screen  # no cursor movement: a dumb terminal shows it as garbage
    first_line = screen.index("otel-rl run | ")
    assert first_line < screen.index("otel-rl-test: the loop ended"), screen[-2000:]  # while the loop ran


def test_the_panel_says_the_live_bottleneck_on_a_line_of_its_own(tmp_path):
    """The live verdict under the tables, as analyze would say it of the last seconds; in a dumb terminal's plain lines too."""
    screen = in_terminal(tmp_path, environment(), UNTIL_SEEN, seen=b"Bottleneck: learner (learning)")
    assert "otel-rl-test: done" in screen
    frame = screen[screen.rindex("Bottleneck: learner (learning)") - 4000 :]
    assert "╭─ otel-rl" in frame or "│" in frame, screen[-3000:]  # drawn inside the panel
    plain = in_terminal(tmp_path / "dumb", environment(TERM="dumb"), UNTIL_SEEN, seen=b"bottleneck: learner (learning)")
    assert "| bottleneck: learner (learning)" in plain, plain[-2000:]


STATUS = """
import os, sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    size, began = 0, time.monotonic()
    while not os.path.exists(sys.argv[2] + "1") and time.monotonic() - began < 60:  # warm-up: the buffer fills until the terminal shows it
        tel.scalars({"Train/buffer_size": size, "Train/learning_starts": 1000})
        size = min(size + 50, 950)
        time.sleep(0.1)
    tel.event("warmup_done")
    i, began = 0, time.monotonic()
    tel.status("ERROR: reward diverged")
    while not os.path.exists(sys.argv[2]) and time.monotonic() - began < 60:  # until the terminal shows it
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                time.sleep(0.02)
        tel.scalars({"Loss/critic": 20.0, "Train/buffer_size": 1000 + i, "Train/grad_norm": 0.5})
        i += 1
tel.close()
print("otel-rl-test: done", flush=True)
"""


def test_the_status_line_says_the_buffer_fill_then_the_loops_own_status(tmp_path):
    """Seed 003's status: "Buffer fill: x/y (p%)" while the replay buffer fills, then what the loop says (an error at once)."""
    screen = in_terminal(tmp_path, environment(), STATUS, seen=(b"ERROR: reward diverged", b"/1,000 ("))
    assert "otel-rl-test: done" in screen
    assert re.search(r"Buffer fill: [\d,]+/1,000 \(\d+%\)", screen), screen[-3000:]
    last = screen[screen.rindex("╭─ otel-rl") :]
    assert "ERROR: reward diverged" in last and "Buffer fill" not in last
    assert "Loss/critic" in last and "  Train/grad_norm" in last  # the loss, and the training diagnostics indented


STALLED = """
import json, os, sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0, shutdown_timeout_s=5.0)
with tel.run():
    i, began = 0, time.monotonic()
    while not os.path.exists(sys.argv[2]) and time.monotonic() - began < 60:  # until the terminal has stopped reading
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                time.sleep(0.002)
        tel.scalars({"Loss/critic": 1.0, **{f"Custom/key_{k}": float(k) for k in range(40)}})  # a tall panel: much to draw
        i += 1
    for _ in range(200):  # the panel goes on drawing into a terminal that reads no more
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                time.sleep(0.01)
        i += 1
began = time.monotonic()
tel.close()
with open(sys.argv[3], "w") as out:
    json.dump({"close_s": time.monotonic() - began}, out)
"""


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_terminal_that_stops_reading_holds_neither_close_nor_the_exit(tmp_path, agent):
    """Ctrl-S, or a stalled ssh connection: the panel and the end line wait in a bounded queue, never on the closing thread."""
    leader, follower = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    stop, result = tmp_path / "stopped", tmp_path / "close.json"
    process = subprocess.Popen([sys.executable, "-c", STALLED, str(tmp_path / "run"), str(stop), str(result)],
                               stdin=follower, stdout=follower, stderr=follower, env=environment(OTEL_RL_AGENT=agent))  # fmt: skip
    os.close(follower)
    shown = bytearray()
    deadline = time.monotonic() + 60
    while b"Loss/critic" not in shown and time.monotonic() < deadline:  # the panel is up: from here on, nobody reads
        if select.select([leader], [], [], 0.2)[0]:
            shown += os.read(leader, 1 << 16)
    assert b"Loss/critic" in shown
    stop.touch()
    try:
        assert process.wait(timeout=60) == 0  # it exits, and cleanly: no thread holds a stream's lock at the exit
    finally:
        process.kill()
        os.close(leader)
    assert json.loads(result.read_text())["close_s"] < 5.0  # within its deadline (1 s here, the end line's bound)


CUDA_LOOP = """
import sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    for i in range(100):
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning", cuda=True):  # no CUDA on this machine: timed on the host, and said once
                time.sleep(0.02)
        if i == 10:
            tel.scalars({"Train/mean_reward": float("nan")})  # said by the agent, logged here
        if i == 20:
            tel.scalars({"Loss/a b?": 1.0})  # said by the agent, logged here
        if i == 30:
            tel.reward_terms([1.0])  # said here, on the training thread
tel.close()
print("otel-rl-test: done", flush=True)
"""


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_warnings_while_the_panel_draws_are_said_above_it_and_leave_one_frame(tmp_path, agent):
    """The README's loop with a CUDA phase on a machine without CUDA, a reward gone NaN and a key of the wrong shape
    (the agent says them) and reward terms that are not a mapping (the training thread says it): each line is printed above the panel, once, and the terminal shows one
    frame at the end (a line printed over a frame left an old frame's header on the screen)."""
    import pyte

    raw = in_terminal(tmp_path, environment(OTEL_RL_AGENT=agent), CUDA_LOOP)
    assert "otel-rl-test: done" in raw
    screen = pyte.Screen(140, 60)
    stream = pyte.Stream(screen)
    stream.feed(raw.replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display]
    headers = [line for line in shown if line.lstrip().startswith("╭─ otel-rl")]
    assert len(headers) == 1, "\n".join(shown)
    for words in ("CUDA phases are timed on the host", "Train/mean_reward is nan", "reward_terms() takes a mapping", "must be namespaced"):
        said = [line for line in shown if words in line and "│" not in line]
        assert len(said) == 1 and shown.index(said[0]) < shown.index(headers[0]), (words, "\n".join(shown))  # once, above the panel


LONG_ITERATION = """
import os, sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    for i in range(4):  # SB3 PPO's shape: each iteration's env steps include the rollout it learns from
        with tel.iteration(i, env_steps=2048 * (i + 1)):
            with tel.phase("learning"):
                began = time.monotonic()
                while i == 3 and not os.path.exists(sys.argv[2]) and time.monotonic() - began < 60:
                    time.sleep(0.05)  # the last one runs until the terminal has shown it under way
                time.sleep(0.05)
    print("otel-rl-test: the loop ended", flush=True)
tel.close()
print("otel-rl-test: done", flush=True)
"""


def test_an_iteration_longer_than_the_window_is_counted_while_it_runs(tmp_path):
    """Progress counts the iteration under way: its env steps, and that it has run for a while (it lagged one
    iteration: the steps of the last one that ended, and 'Avg 2s (n=0)' while a long one ran)."""
    screen = in_terminal(tmp_path, environment(TERM="dumb"), LONG_ITERATION, seen=b"iteration 3 under way for")
    assert "otel-rl-test: done" in screen, screen[-2000:]
    line = next(line for line in screen.splitlines() if "iteration 3 under way for" in line)
    assert "| 8,192 steps |" in line, line  # iteration 3's start: 2,048 of each of its 4 rollouts
    assert screen.index("iteration 3 under way for") < screen.index("otel-rl-test: the loop ended")
    framed = in_terminal(tmp_path / "framed", environment(), LONG_ITERATION, seen=b"iteration 3 under way for")
    assert re.search(r"8,192 steps · Last 3 iterations \(\d+s ago; iteration 3 under way for \d+s\)", framed), framed[-3000:]

"""The live panel as a user sees it: on by default in a real terminal (a pseudo-terminal), off with OTEL_RL_PANEL=0 or off a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

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


def in_terminal(tmp_path, env: dict) -> str:
    """What the loop wrote to a pseudo-terminal of 140 columns, as a person's terminal shows it."""
    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    process = subprocess.Popen([sys.executable, "-c", LOOP, str(tmp_path / "run")], stdin=follower, stdout=follower, stderr=follower, env=env)
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
        elif process.poll() is not None and b"otel-rl-test: done" in out:
            break
    process.wait(timeout=30)
    os.close(leader)
    return out.decode("utf-8", "replace")


def environment(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
    env.update(TERM="xterm-256color", COLUMNS="140", LINES="50", **extra)
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

"""The command line with wrong input: one line naming what is wrong, a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_rl.version import __version__


def cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    return subprocess.run([sys.executable, "-m", "otel_rl.cli", *args], capture_output=True, text=True, timeout=timeout_s, env=env)


def test_version_and_help_say_what_every_option_defaults_to():
    assert cli("--version").stdout.strip() == f"otel-rl {__version__}"
    top = cli("--help").stdout
    assert "``" not in top and "otel-rl: OpenTelemetry-native telemetry" in top
    serve = " ".join(cli("serve", "--help").stdout.split())
    assert "TCP port (default: 8080)" in serve and "(default: 127.0.0.1)" in serve


@pytest.mark.parametrize(
    ("args", "says", "code"),
    [
        (("serve", "--port", "99999"), "99999 is not a TCP port", 2),
        (("analyze", "NOT_A_TRACE"), "is not a readable Perfetto trace", 1),
        (("analyze", "MISSING"), "no trace at", 2),
        (("analyze", "RUN_DIR", "--plot", "/no/such/folder/plot.png"), "--plot /no/such/folder/plot.png: no such folder", 2),
        (("backfill", "RUN_DIR", "--url", "http://127.0.0.1:9", "--retry-window", "1"), "unavailable", 1),
    ],
)
def test_wrong_input_gets_one_line_and_a_non_zero_exit(tmp_path, args, says, code):
    not_a_trace = tmp_path / "junk.perfetto-trace"
    not_a_trace.write_bytes(b"\x0a\x05" + b"\xff" * 5)  # framed like trace packets, not one inside
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"run_id":"r","writer":"h:1","seq":1,"ts":1.0,"kind":"heartbeat"}\n')
    (run_dir / "trace.perfetto-trace").write_bytes(b"")
    named = {"NOT_A_TRACE": str(not_a_trace), "MISSING": str(tmp_path / "missing"), "RUN_DIR": str(run_dir)}
    result = cli(*[named.get(a, a) for a in args], timeout_s=180)
    assert result.returncode == code, result.stderr
    assert says.lower() in result.stderr.lower() and "Traceback" not in result.stderr


def test_analyze_into_a_pipe_closed_early_ends_without_a_traceback(tmp_path):
    import otel_rl

    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(50):
            with tel.iteration(i, env_steps=i):
                with tel.phase("learning"):
                    pass
    tel.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    # `true` reads nothing and is gone before analyze prints: every write meets a closed pipe, as `| head` does past its lines.
    piped = subprocess.run(f"{sys.executable} -m otel_rl.cli analyze {tmp_path} | true", shell=True, capture_output=True, text=True,
                           timeout=120, env=env)  # fmt: skip
    assert piped.stderr == ""


def test_analyze_refuses_a_fifo_instead_of_reading_it_forever(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    result = cli("analyze", str(fifo), timeout_s=60)
    assert result.returncode == 2 and result.stderr.strip() == f"otel-rl analyze: {fifo} is not a trace file or a run folder"


def test_analyze_skips_a_fifo_named_like_a_trace_inside_a_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "trace.perfetto-trace")
    result = cli("analyze", str(run), timeout_s=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"otel-rl analyze: no *.perfetto-trace file in {run} (trace.perfetto-trace: not regular files)"


def test_serve_on_a_port_in_use_is_one_line_and_a_non_zero_exit(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = cli("serve", "--host", "127.0.0.1", "--port", str(port), "--db", str(tmp_path / "runs.db"), "--insecure")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"otel-rl serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "ingest server on" not in done.stdout  # nothing said about a server that never listened

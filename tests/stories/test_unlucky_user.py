"""An unlucky user's run: a full /dev/shm, a deleted segment, settings that do not apply, a forked child, misused calls.

Each costs only itself: the run is complete, says how it ended, and nothing raises into training.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import requests
from locations import REPO, interruptible

import otel_rl


def jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def python(script: str, *args: str, env: dict | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, env={**clean, **(env or {})})  # fmt: skip


LOOP = """
    with tel.run():
        for i in range(300):
            with tel.iteration(i, env_steps=i):
                with tel.phase("learning"):
                    pass
            tel.scalars({"Loss/critic": float(i)})
    tel.close()
"""


def test_a_full_dev_shm_costs_the_run_nothing(tmp_path):
    # A private mount namespace whose /dev/shm is a 1 MiB tmpfs, filled up before the run starts.
    script = "import sys, otel_rl\ntel = otel_rl.init(run_dir=sys.argv[1])" + textwrap.dedent(LOOP) + "print('ok', tel.stats()['agent'])\n"
    (tmp_path / "train.py").write_text(script)
    shell = (
        "mount -t tmpfs -o size=1m tmpfs /dev/shm && (head -c 2M /dev/zero > /dev/shm/filler 2>/dev/null; true) && "
        f"{sys.executable} {tmp_path / 'train.py'} {tmp_path / 'run'}"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run(["unshare", "--mount", "sh", "-c", shell], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "thread"]  # no room for a segment: the outputs ran on a thread
    records = jsonl(tmp_path / "run")
    assert sum(1 for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 300
    assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_a_deleted_segment_and_a_dead_agent_still_end_the_run(tmp_path):
    result = python(
        """
        import os, signal, sys, time, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1])
        with tel.run():
            for i in range(3000):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        pass
                tel.scalars({"Loss/critic": float(i)})
                if i == 1000:
                    tel.flush()
                    os.unlink(tel._host.segment.path)  # another process of the user removes it
                    os.kill(tel._host.agent_pid(), signal.SIGKILL)
                    time.sleep(0.2)
        tel.close()
        print("closed")
        """,
        str(tmp_path / "run"),
    )
    assert result.returncode == 0 and result.stdout.strip() == "closed", result.stderr
    records = jsonl(tmp_path / "run")
    steps = [r["step"] for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps == list(range(3000))
    assert [r["status"] for r in records if r["kind"] == "run"][-1] == "finished"


@pytest.mark.parametrize(
    "variable", [("OTEL_RL_RESUME", "1"), ("OTEL_RL_TENSORBOARD", "1"), ("OTEL_RL_TRACE_ENABLED", "true"), ("OTEL_RL_PROFILE", "1,2")]
)
def test_an_environment_setting_that_does_not_apply_is_ignored_with_one_warning(monkeypatch, caplog, variable):
    name, value = variable
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.init(system_metrics_interval_s=0)
        with tel.run():
            tel.scalars({"Loss/critic": 1.0})
        tel.close()
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    other = {"OTEL_RL_TRACE_ENABLED": " or trace_output_dir", "OTEL_RL_PROFILE": " or trace_output_dir", "OTEL_RL_TENSORBOARD": " or tensorboard_dir"}
    assert said == [f"otel-rl: {name}={value} is ignored here: this process has no run_dir" + other.get(name, "")]
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")  # the kill switch wins over everything, and says nothing
    caplog.clear()
    assert otel_rl.init().enabled is False and not caplog.records


def test_a_job_restarted_with_resume_in_its_environment_starts_its_workers(tmp_path):
    script = tmp_path / "job.py"  # a file: spawned workers import their target from it
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, sys, otel_rl
        from otel_rl.worker_processes import init_worker

        def work(spec):
            tel = init_worker(spec)
            with tel.iteration(0, timeline="collector"):
                with tel.phase("env_step", timeline="collector"):
                    pass
            tel.close()

        if __name__ == "__main__":
            tel = otel_rl.init(run_dir=sys.argv[1])
            ctx = mp.get_context("spawn")
            with tel.run():
                worker = ctx.Process(target=work, args=(tel.worker_spec("collector 0", ctx),))
                worker.start()
                worker.join(60)
            tel.close()
            print("worker exit", worker.exitcode)
        """))
    result = python("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                    str(script), str(tmp_path / "run"), env={"OTEL_RL_RESUME": "1"})  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "worker exit 0", result.stderr
    assert "Traceback" not in result.stderr


def test_a_forked_child_outliving_its_killed_parent_does_not_hold_the_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], quiet=True)
        tel.start_run()
        if os.fork() == 0:  # a child (a data loader's, say) that lives on
            os.write(1, b"child\\n")  # past its fork handlers (one write: the lines cannot interleave)
            time.sleep(60)
            os._exit(0)
        os.write(1, b"parent\\n")
        time.sleep(60)
        """), str(run_dir)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert {parent.stdout.readline().strip(), parent.stdout.readline().strip()} == {"parent", "child"}
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    try:
        tel = otel_rl.init(run_dir=run_dir, resume=True, quiet=True)  # not refused: the folder's writer is dead
        with tel.run():
            tel.scalars({"Loss/critic": 1.0})
        tel.close()
        events = [r["name"] for r in jsonl(run_dir) if r["kind"] == "event"]
        assert "resumed" in events
    finally:
        subprocess.run(["pkill", "-f", "otel_rl.init\\(run_dir=sys.argv\\[1\\], quiet=True\\)"], check=False)


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_phase_never_exited_inside_an_iteration_costs_only_itself(tmp_path, caplog, agent):
    tel = otel_rl.init(run_dir=tmp_path, agent=agent, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run():
            for i in range(20):
                with tel.iteration(i, env_steps=i):
                    if i == 5:
                        tel.phase("inference").__enter__()  # never exited
                    with tel.phase("learning"):
                        pass
        assert tel.flush(30)
        misused = tel.stats()["dropped"]["phase_misuse"]
        tel.close()
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 20
    assert misused == 1
    assert sum("was never exited" in r.getMessage() for r in caplog.records) == 1


def test_end_run_with_a_message_ends_the_run_as_failed_with_it(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    tel.start_run()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.end_run("oops")
    tel.close()
    (end,) = [r for r in jsonl(tmp_path) if r["kind"] == "run" and r["status"] not in ("pending", "running")]
    assert end["status"] == "failed" and end["reason"] == "RuntimeError: oops"
    assert sum("end_run() takes an exception or None" in r.getMessage() for r in caplog.records) == 1


def test_a_run_dir_that_is_a_file_is_refused_before_anything_starts(tmp_path):
    path = tmp_path / "not-a-folder"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        otel_rl.init(run_dir=path)
    with pytest.raises(ValueError, match=f"lies below '{path}', which is a file, not a folder"):
        otel_rl.init(run_dir=path / "deeper" / "run")
    assert path.read_text() == "x"


def test_the_protocol_documents_schema_is_the_packages():
    root = REPO
    documented = root / "docs" / "protocol" / "motrix-metrics-v1.schema.json"
    assert documented.read_bytes() == (root / "otel_rl" / "formats" / "motrix-metrics-v1.schema.json").read_bytes()


@pytest.mark.parametrize("attempt", range(3))
def test_a_resume_right_after_an_early_sigkill_continues_the_killed_run(tmp_path, attempt):
    from otel_rl.readers.analysis import protobuf_engine

    run_dir = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], quiet=True)
        with tel.run():
            for i in range(1_000_000):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        time.sleep(0.001)
                tel.scalars({"Loss/critic": float(i)})
                if i == 10:
                    print("10", flush=True)
        """), str(run_dir)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert killed.stdout.readline().strip() == "10"
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    tel = otel_rl.init(run_dir=run_dir, resume=True, quiet=True, system_metrics_interval_s=0)
    with tel.run():
        with tel.iteration(10_000, env_steps=10_000):
            with tel.phase("learning"):
                pass
    tel.close()
    records = jsonl(run_dir)
    (resumed,) = [r for r in records if r["kind"] == "event" and r["name"] == "resumed"]
    assert resumed["attributes"]["previous_status"] == "killed"
    first = protobuf_engine.read([run_dir / "trace.perfetto-trace"])  # the killed part's trace, kept
    assert sum(1 for s in first.slices if s.name == "Learning") >= 11
    assert (run_dir / "trace.resume-1.perfetto-trace").exists()


def test_records_the_live_service_did_not_get_by_the_deadline_are_counted_and_the_backfill_named(tmp_path, caplog):
    from otel_rl.readers.server import IngestServer

    server = IngestServer(tmp_path / "ingest.sqlite3").__enter__()
    url = server.url
    tel = otel_rl.init(run_dir=tmp_path / "run", motrix_url=url, shutdown_timeout_s=2, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run():
            for i in range(200):
                tel.scalars({"Loss/critic": float(i)})
            assert tel.flush(30)
            server.__exit__(None, None, None)  # the service goes down for the rest of the run
            for i in range(200, 5000):
                tel.scalars({"Loss/critic": float(i)})
        tel.close()
    said = [r.getMessage() for r in caplog.records if "the live service did not get" in r.getMessage()]
    assert len(said) == 1
    count = int(said[0].split("did not get ")[1].split()[0])
    assert count > 4000  # what was queued for it since it went down, the end of the run among them
    assert f"otel-rl backfill {tmp_path / 'run'} --url {url}" in said[0]
    assert tel.stats()["dropped"]["http"] >= count
    stored = [r for r in jsonl(tmp_path / "run") if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert len(stored) == 5000  # metrics.jsonl has every one


def test_in_a_containers_64_mib_dev_shm_the_segment_leaves_a_dataloader_its_room(tmp_path):
    script = textwrap.dedent("""
        import glob, os, sys, torch, otel_rl
        from torch.utils.data import DataLoader, Dataset

        class Samples(Dataset):  # 8 MiB a sample: the workers hand them over through /dev/shm
            def __len__(self):
                return 16
            def __getitem__(self, i):
                return torch.full((2 * 1024 * 1024,), float(i))

        tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0, quiet=True)
        (segment,) = [os.path.getsize(p) for p in glob.glob(f"/dev/shm/otel-rl-{os.getuid()}/*/*-{os.getpid()}-*.seg")]  # its own
        batches = 0
        with tel.run():
            for i, batch in enumerate(DataLoader(Samples(), batch_size=1, num_workers=2)):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        batches += int(batch.numel() == 2 * 1024 * 1024)
        tel.close()
        print(segment, batches, tel.stats()["agent"])
    """)
    (tmp_path / "train.py").write_text(script)
    shell = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {sys.executable} {tmp_path / 'train.py'} {tmp_path / 'run'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run(["unshare", "--mount", "sh", "-c", shell], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    segment_bytes, batches, host = result.stdout.split()
    assert int(segment_bytes) <= 8 << 20 and batches == "16" and host == "process"
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["status"] == "finished" and summary["timelines"]["learner"]["phases"]["learning"]["count"] == 16


@pytest.mark.parametrize("implementation", ["c", "python"])
@pytest.mark.parametrize("length", [0, 4096, 1 << 20])
def test_a_segment_truncated_by_another_process_costs_training_nothing_and_ends_the_run(tmp_path, implementation, length):
    result = python(
        f"""
        import subprocess, sys, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
        with tel.run():
            for i in range(3000):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        pass
                tel.scalars({{"Loss/critic": float(i)}})
                if i == 1000:
                    tel.flush()
                    subprocess.run(["truncate", "-s", "{length}", tel._host.segment.path], check=True)  # another process
        tel.close()
        print("training survived")
        """,
        str(tmp_path / "run"),
        env={"OTEL_RL_PURE_PYTHON": "1"} if implementation == "python" else {},
    )
    assert result.returncode == 0 and result.stdout.strip() == "training survived", result.stderr
    assert "truncated this run's shared-memory segment" in result.stderr
    records = jsonl(tmp_path / "run")
    steps = [r["step"] for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps[:1001] == list(range(1001))  # everything flushed before it
    (end,) = [r for r in records if r["kind"] == "run" and r["status"] not in ("pending", "running")]
    assert end["status"] == "failed" and "truncated by another process" in end["reason"]
    assert not list(Path(f"/dev/shm/otel-rl-{os.getuid()}").glob(f"*/{tmp_path.name}*.seg"))


@pytest.mark.parametrize("implementation", ["c", "python"])
def test_a_sweep_of_runs_in_one_process_keeps_none_of_their_segments_mapped(tmp_path, implementation):
    result = python(
        """
        import sys, otel_rl
        for trial in range(4):  # an Optuna-style sweep: one run after the other in one process
            tel = otel_rl.init(run_dir=f"{sys.argv[1]}/{trial}", quiet=True, system_metrics_interval_s=0)
            with tel.run():
                for i in range(20):
                    with tel.iteration(i, env_steps=i):
                        with tel.phase("learning"):
                            pass
            tel.close()
        print(sum(1 for line in open("/proc/self/maps") if ".seg" in line))
        """,
        str(tmp_path),
        env={"OTEL_RL_PURE_PYTHON": "1"} if implementation == "python" else {},
    )
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stderr  # 44 MiB of /dev/shm each, else
    for trial in range(4):
        summary = json.loads((tmp_path / str(trial) / "run_summary.json").read_text())
        assert summary["status"] == "finished" and summary["timelines"]["learner"]["phases"]["learning"]["count"] == 20


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_an_exception_between_init_and_the_run_ends_the_announced_run_failed_with_its_reason(tmp_path, agent):
    script = textwrap.dedent(f"""
        import sys, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], agent={agent!r}, system_metrics_interval_s=0)
        raise RuntimeError("the environment config is missing")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1 and "RuntimeError: the environment config is missing" in result.stderr
    runs = [r for r in jsonl(tmp_path) if r["kind"] == "run"]
    assert [r["status"] for r in runs] == ["pending", "failed"]
    assert runs[-1]["reason"] == "RuntimeError: the environment config is missing"
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"] == "RuntimeError: the environment config is missing"
    assert result.stderr.strip().splitlines()[-1].startswith(f"otel-rl: run {tmp_path.name} failed after "), result.stderr


def test_a_service_down_from_the_start_is_said_early_once_and_the_end_line_times_the_run_not_the_close(tmp_path):
    from fault_servers import refused_url

    # The loop goes on until the test has read the line (two minutes at most): "early" is "while the run goes on", on any machine.
    seen = tmp_path / "seen"
    script = textwrap.dedent(f"""
        import os, sys, time, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], motrix_url={refused_url()!r}, system_metrics_interval_s=0)
        with tel.run():
            i, began = 0, time.monotonic()
            while not os.path.exists(sys.argv[2]) and time.monotonic() - began < 120:
                with tel.iteration(i, env_steps=8 * i):
                    with tel.phase("learning"):
                        time.sleep(0.05)
                tel.scalars({{"Loss/critic": 0.5 * i}})
                i += 1
        print("otel-rl-test: the loop ended", file=sys.stderr, flush=True)
        tel.close(timeout_s=3)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run"), str(seen)], stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if "cannot take records" in line:
                seen.touch()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert process.wait(timeout=300) == 0, "\n".join(lines)
    reader.join(30)
    down = [i for i, line in enumerate(lines) if "cannot take records" in line]
    assert len(down) == 1 and "otel-rl backfill" in lines[down[0]]
    assert down[0] < lines.index("otel-rl-test: the loop ended")  # while the run went on, not at its end
    (end,) = [line for line in lines if " finished after " in line]
    said_s = float(end.split(" finished after ")[1].split(" s")[0])
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    run_s = (summary["end_time_unix_nano"] - summary["start_time_unix_nano"]) / 1e9
    assert abs(said_s - run_s) < 0.3, (said_s, run_s)  # the close deadline (3 s here) is not in it


STREAMING = """
import sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], run_id=sys.argv[3], motrix_url=sys.argv[2], system_metrics_interval_s=0, {options})
with tel.run():
    for i in range(int(sys.argv[4])):
        with tel.iteration(i, env_steps=i):
            with tel.phase("learning"):
                pass
        tel.scalars({{"Loss/value": float(i)}}, step=i)
began = time.monotonic()
tel.close()
print(time.monotonic() - began)
"""
"""A run streaming to ``argv[2]`` (run id ``argv[3]``, ``argv[4]`` iterations) that prints how long its close took."""


def test_a_service_that_never_answers_gets_every_record_once_it_is_back(tmp_path):
    """It accepts connections and never answers; the run ends on time. What the live stream never delivered is sent by
    the background backfill (records first, then the trace) once a real server answers on that address."""
    from fault_servers import SilentServer
    from ports import held_port
    from uploads import upload_outcome

    from otel_rl.readers.server import IngestServer

    script = STREAMING.format(options="shutdown_timeout_s=3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    with held_port() as port:
        url = f"http://127.0.0.1:{port}"
        silent = SilentServer(port)
        try:
            run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run"), url, "hung", "2000"], capture_output=True, text=True, timeout=180, env=env)
        finally:
            silent.stop()
        assert run.returncode == 0, run.stderr
        assert float(run.stdout.strip().splitlines()[-1]) < 3 + 5  # the close kept its deadline
        assert "a backfill in the background sends them when the service is back" in run.stderr
        # The last line says the upload goes on in a process of its own, and how to send it should the job's end stop it.
        (end,) = [line for line in run.stderr.splitlines() if " finished after " in line]
        assert f"its trace and diagnosis are still on their way to {url}" in end and f"otel-rl backfill {tmp_path / 'run'} --url {url} --trace-only" in end
        with IngestServer(str(tmp_path / "back.sqlite3"), port=port, reuse_port=True) as server:  # the service is back
            outcome = upload_outcome(tmp_path / "run")
            assert outcome["sent"] is True and outcome["records"]["accepted"] > 2000, outcome
            points = requests.get(server.url + "/api/v1/runs/hung/scalars", params={"key": "Loss/value", "points": 5000}, timeout=30).json()["points"]
            assert sorted(p["value"] for p in points) == [float(i) for i in range(2000)]  # every record, once
            assert requests.get(server.url + "/api/v1/runs/hung", timeout=30).json()["run"]["status"] == "finished"
            assert requests.get(server.url + "/api/v1/runs/hung/trace", timeout=30).status_code == 200


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_ctrl_c_in_a_close_waiting_on_a_hung_service_ends_the_wait_at_once_and_says_where_the_records_are(tmp_path, agent):
    """close() waits up to its 20 s deadline for a service that never answers; the first Ctrl-C ends that wait at once
    (the outputs finish what they can), says the records are in the folder, and the program stops as a Ctrl-C stops it."""
    from fault_servers import SilentServer

    script = textwrap.dedent("""
        import sys, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], motrix_url=sys.argv[2], agent=sys.argv[3], system_metrics_interval_s=0, shutdown_timeout_s=20)
        with tel.run():
            for i in range(200):
                with tel.iteration(i, env_steps=i):
                    pass
                tel.scalars({"Loss/value": float(i)}, step=i)
        print("closing", flush=True)
        tel.close()
        print("closed", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    silent = SilentServer()
    try:
        process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run"), silent.url, agent], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, preexec_fn=interruptible)  # fmt: skip
        assert process.stdout.readline().strip() == "closing"
        time.sleep(1.0)  # inside close(), waiting on the service
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        silent.stop()
    assert process.returncode != 0 and "closed" not in stdout  # stopped, as a Ctrl-C stops a program
    assert took < 8, took  # not the 19 s left of the deadline (about 1.7 s here)
    said = [line for line in stderr.splitlines() if "interrupted while closing" in line]
    assert len(said) == 1 and str(tmp_path / "run") in said[0] and "otel-rl backfill" in said[0], stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in records if r["kind"] == "scalars" and "Loss/value" in r["values"]) == 200
    assert [r["status"] for r in records if r["kind"] == "run"][-1] == "finished"


def test_a_job_killed_at_its_end_can_have_close_wait_for_the_upload(tmp_path):
    """upload_wait_s makes close() wait (bounded) until the trace and diagnosis reached the service, and say so;
    then the job's end may kill every process. A service that is down past the bound: said, with the command that sends it."""
    from ports import refused_port

    from otel_rl.readers.server import IngestServer

    script = STREAMING.format(options="upload_wait_s=float(sys.argv[5])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    with IngestServer(str(tmp_path / "db.sqlite3")) as server:
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "sent"), server.url, "sent", "200", "300"], capture_output=True, text=True, timeout=400, env=env)
        assert run.returncode == 0, run.stderr
        (end,) = [line for line in run.stderr.splitlines() if " finished after " in line]
        assert f"its trace and diagnosis reached {server.url}" in end, run.stderr
        assert json.loads((tmp_path / "sent" / "trace_upload.json").read_text())["sent"] is True  # there when close() returned
        assert requests.get(server.url + "/api/v1/runs/sent/trace", timeout=30).status_code == 200
    url = f"http://127.0.0.1:{refused_port()}"  # nothing listens: the upload keeps trying past the bound
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "down"), url, "down", "200", "2"], capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 0, run.stderr
    (end,) = [line for line in run.stderr.splitlines() if " finished after " in line]
    assert f"still on their way to {url} after 2 s" in end and f"otel-rl backfill {tmp_path / 'down'} --url {url} --trace-only" in end
    assert float(run.stdout.strip().splitlines()[-1]) < 5 + 2 + 5  # the close's deadline, the bound, and margin: never the upload's own


def test_a_full_dev_shm_at_init_is_one_line_and_training_records_on_a_thread(tmp_path):
    # A machine of its own /dev/shm (a mount namespace), 64 KiB and full: no segment, and no agent started for none.
    loop = tmp_path / "loop.py"
    loop.write_text(textwrap.dedent(f"""
        import otel_rl
        tel = otel_rl.init(run_dir={str(tmp_path / "run")!r}, panel=False, system_metrics_interval_s=0)
        with tel.run():
            for i in range(5):
                with tel.iteration(i, env_steps=i):
                    pass
        tel.close()
        print("agent:", tel.stats()["agent"])
    """))
    script = f"mount -t tmpfs -o size=64k tmpfs /dev/shm && (dd if=/dev/zero of=/dev/shm/fill bs=4k count=100 2>/dev/null; true) && " \
             f"{sys.executable} {loop} && sleep 2"  # fmt: skip
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agent: thread" in done.stdout and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "shared memory" in line]
    assert len(said) == 1 and "the outputs run on a thread" in said[0], done.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"

"""A job of two machines is one run: real ``torchrun --nnodes 2`` launchers on loopback, one agent per machine.

Each machine is a launcher of its own, in a UTS namespace with its own host
name (``unshare --uts``, as root), node 1 with its wall clock a quarter of a
second ahead (``skewed_clock.c``, preloaded). Four ranks share one run folder, as a shared filesystem
would; rank 3 (on node 1) learns twice as slowly and the others wait for it
in their all-reduce. The run's files, its trace, its analysis and the ingest
server's view of it are checked against that truth.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from locations import SUPPORT
from ports import free_port

from otel_rl.formats import schema, trace
from otel_rl.readers.analysis import read_trace
from otel_rl.readers.analysis import analyze_model
from otel_rl.readers.server.serving import IngestServer

SKEW_S = 0.25
ITERATIONS = 100
SLOW_RANK = 3
HOSTS = ("node0", "node1")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("cc") is None,
    reason="needs root (unshare --uts) and a C compiler (the skewed clock)",
)]


def _launcher(node: int, port: int, run_dir: Path, ingest: str, skewed_clock: Path) -> subprocess.Popen:
    """One machine: its own host name, its own agent, node 1's wall clock ahead by SKEW_S."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(OTEL_RL_AGENT=f"multinode{port}-{node}", MOTRIX_METRICS_URL=ingest, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    if node == 1:
        env.update(LD_PRELOAD=str(skewed_clock), SKEWED_CLOCK_NS=str(int(SKEW_S * 1e9)))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
                "--master-addr", "127.0.0.1", "--master-port", str(port), str(SUPPORT / "multinode_job.py"), str(run_dir), str(ITERATIONS), str(SLOW_RANK)]  # fmt: skip
    script = f'hostname {HOSTS[node]} && exec "$@"'
    return subprocess.Popen(["unshare", "--uts", "sh", "-c", script, "sh", *torchrun], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job's run folder and what the ingest server holds of it, after both launchers ended."""
    tmp = tmp_path_factory.mktemp("multinode")
    run_dir = tmp / "multi"
    skewed_clock = tmp / "skewed_clock.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(skewed_clock), str(SUPPORT / "skewed_clock.c"), "-ldl"], check=True)
    with IngestServer(tmp / "ingest.sqlite3") as server:
        port = free_port()
        launchers = [_launcher(node, port, run_dir, server.url, skewed_clock) for node in (0, 1)]
        outputs = [launcher.communicate(timeout=240)[0] for launcher in launchers]
        for launcher, output in zip(launchers, outputs):
            assert launcher.returncode == 0, output[-4000:]
        runs = json.load(urllib.request.urlopen(server.url + "/api/v1/runs"))["runs"]
        keys = json.load(urllib.request.urlopen(server.url + "/api/v1/runs/multi/keys"))["keys"]
        rank_keys = [k for k in keys if schema.parse_rank_key(k)]
        query = "&".join(f"key={k}" for k in rank_keys if k.endswith("/learning_time"))
        points = json.load(urllib.request.urlopen(f"{server.url}/api/v1/runs/multi/scalars?{query}&max_points=1000"))
        page = _rank_table_in_a_browser(server.url, tmp / "ranks.png")
    return {"run_dir": run_dir, "outputs": outputs, "runs": runs, "keys": keys, "points": points, "page": page}


def _rank_table_in_a_browser(url: str, screenshot: Path) -> dict:
    """The run page's rank table as headless Chromium renders it: each row's cells and the columns marked slowest."""
    from browser import Browser

    browser = Browser()
    try:
        browser.goto(f"{url}/runs/multi")
        rows = browser.wait_for("document.querySelectorAll('#rank-table tr[data-rank]').length === 4 && "
                                "[...document.querySelectorAll('#rank-table tr[data-rank]')].map(r => [r.dataset.rank, "
                                "[...r.querySelectorAll('td.slowest')].map(td => td.cellIndex)])")  # fmt: skip
        header = browser.eval("[...document.querySelectorAll('#rank-table th')].map(th => th.textContent)")
        charts = browser.eval("[...document.querySelectorAll('.chart')].map(c => c.dataset.key)")
        browser.screenshot(screenshot)
        return {"rows": dict(rows), "header": header, "charts": charts, "screenshot": screenshot.stat().st_size}
    finally:
        browser.close()


def test_every_file_parses_and_one_writer_wrote_each(job):
    run_dir = job["run_dir"]
    names = sorted(p.name for p in run_dir.iterdir())
    assert "trace.node-0.perfetto-trace" in names and "trace.node-1.perfetto-trace" in names, names
    assert not [n for n in names if n.startswith("trace-") or n.endswith((".partial", ".tmp"))], names  # every fragment taken in
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["rank"] == 0 and summary["world_size"] == 4 and summary["status"] == "finished"
    learning = summary["timelines"]["learner"]["phases"]["learning"]
    assert learning["count"] == ITERATIONS and learning["mean_ms"] < 35  # rank 0's (20 ms), not rank 3's (40 ms)
    json.loads((run_dir / "run_config.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert {r["writer"].split(":")[0] for r in records} == {HOSTS[0]}  # rank 0 alone wrote it
    for output in job["outputs"]:
        assert "could not write" not in output and "Traceback" not in output, output[-3000:]


def test_every_rank_is_in_the_timeline_once_named_by_rank_and_host(job):
    model, _ = read_trace(job["run_dir"])
    learning = [s for s in model.slices if s.category == schema.LEARNER and s.name == "Learning"]
    per_process = {p: sum(1 for s in learning if s.process == p) for p in {s.process for s in learning}}
    expected = {trace.process_name("learner", rank, HOSTS[rank // 2]) for rank in range(4)}
    assert per_process == dict.fromkeys(expected, ITERATIONS)


def test_the_clocks_are_aligned_through_the_collectives(job):
    model, _ = read_trace(job["run_dir"])
    offsets = {trace.parse_process(p)[1]: statistics.median(v) for p, v in model.clock_offsets.items()}
    assert sorted(offsets) == [0, 1, 2, 3]
    for rank, offset in offsets.items():
        expected = SKEW_S * 1000 if rank >= 2 else 0.0
        assert abs(offset - expected) < 20, offsets  # node 1's clock is a quarter of a second ahead
    syncs: dict[int, list[int]] = {}
    for s in sorted(model.slices, key=lambda s: s.start_ns):
        if s.name == "Gradient Sync":
            syncs.setdefault(trace.parse_process(s.process)[1], []).append(s.end_ns)
    spreads = [(max(ends) - min(ends)) / 1e6 for ends in zip(*syncs.values())]
    assert len(spreads) == ITERATIONS
    assert statistics.median(spreads) < 1.0, spreads  # the all-reduce ends together on every rank, once aligned


def test_the_analysis_names_the_straggler_per_rank(job):
    model, _ = read_trace(job["run_dir"])
    report = analyze_model(model)
    found = report.straggler
    assert (found.rank, found.host, found.phase) == (SLOW_RANK, "node1", "learning"), found
    assert 1.6 < found.ratio < 2.6 and found.others_wait_in == "Gradient Sync", found
    rows = report.timelines["learner"].ranks
    assert [r.rank for r in rows] == [0, 1, 2, 3] and all(r.cycles == ITERATIONS for r in rows)
    per_rank = report.env_steps_per_s_by_rank
    assert sorted(per_rank) == ["0", "1", "2", "3"]
    for rate in per_rank.values():  # 64 steps per iteration of about 40-60 ms: each rank's own count
        assert 500 < rate < 3000, per_rank
    assert report.env_steps_per_s == pytest.approx(sum(per_rank.values()), rel=0.15)
    # The live verdict said it while the job ran: rank 0's pipeline reads every rank's timings from its log windows.
    said = [json.loads(line) for line in (job["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    verdicts = [r["attributes"] for r in said if r.get("kind") == "event" and r.get("name") == schema.EVENT_BOTTLENECK]
    assert any(v["text"].startswith(f"learner rank {SLOW_RANK} (learning, ") and v.get("rank") == SLOW_RANK for v in verdicts), verdicts
    # One verdict on every surface: the live verdict's last word, the trace's headline and read.runs over the folder.
    import otel_rl.read

    (row,) = otel_rl.read.runs(job["run_dir"]).to_dict("records")
    last = verdicts[-1]
    assert (last["side"], last.get("phase"), last.get("rank")) == (report.diagnosis.side, "learning", SLOW_RANK), (last, report.diagnosis)
    assert (row["bottleneck_side"], row["bottleneck_phase"]) == (report.diagnosis.side, "learning"), row
    assert report.diagnosis.rank == SLOW_RANK and report.diagnosis.bottleneck.startswith(f"learner rank {SLOW_RANK} (learning, "), report.diagnosis
    cli = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(job["run_dir"])], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "straggler: rank 3 on node1: Learning" in cli.stdout and "the others wait in their Gradient Sync" in cli.stdout, cli.stdout


def test_a_merged_trace_holds_every_part_on_rank_0s_clock(job, tmp_path):
    merged = tmp_path / "job.perfetto-trace"
    cli = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "analyze", str(job["run_dir"]), "--json", "--merged-trace", str(merged)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["straggler"]["rank"] == SLOW_RANK
    parts, _ = read_trace(job["run_dir"])
    one, _ = read_trace(merged)
    key = lambda s: (s.process, s.name, s.start_ns, s.end_ns)  # noqa: E731
    assert sorted(map(key, one.slices)) == sorted(map(key, parts.slices))  # the same slices, at the aligned times


def test_the_run_page_shows_the_ranks_side_by_side_with_the_slowest_marked(job):
    page = job["page"]
    learning = page["header"].index("learning_time (s)")
    assert learning in page["rows"]["3"] and all(learning not in page["rows"][r] for r in "012"), page
    assert not [key for key in page["charts"] if schema.parse_rank_key(key)]  # the table shows them, not a chart each
    assert page["screenshot"] > 10_000


def test_the_server_holds_one_run_with_each_ranks_timings(job):
    assert [run["run_id"] for run in job["runs"]] == ["multi"]
    ranks = {schema.parse_rank_key(k)[0] for k in job["keys"] if schema.parse_rank_key(k)}
    assert ranks == {0, 1, 2, 3}
    last = {}
    for key, series in job["points"]["series"].items():
        last[schema.parse_rank_key(key)[0]] = series["y"][-1]
    assert last[SLOW_RANK] > 1.6 * statistics.median(last.values()), last


SRUN_STYLE = """
import sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0, quiet=True)
with tel.run():
    for i in range(30):
        with tel.iteration(i, env_steps=8 * i):
            with tel.phase("learning"):
                time.sleep(0.002)
tel.close()
print(tel.config.machine)
"""


@pytest.mark.parametrize("launcher", ["ranks only", "slurm", "one host name"])
def test_a_launcher_that_numbers_no_machine_still_gives_each_machine_its_own_trace_part(tmp_path, launcher):
    """srun-style: RANK, WORLD_SIZE and LOCAL_RANK on machines sharing the run folder, no GROUP_RANK or LOCAL_WORLD_SIZE;
    and machines of one host name (containers named alike), each its own /dev/shm, told apart by the id it holds."""
    from otel_rl.base.user_dir import machine_id
    from otel_rl.config import host_machine
    from otel_rl.readers.analysis import analyze, read_trace

    run_dir = tmp_path / "srun"
    hosts = ("hostA", "node", "node") if launcher == "one host name" else ("hostA", "hostB")
    launched = []
    for rank, host in enumerate(hosts):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "SLURM_", "GROUP_RANK", "LOCAL_")) or k == "OTEL_RL_RUN_DIR"}
        env.update(RANK=str(rank), WORLD_SIZE=str(len(hosts)), LOCAL_RANK="0", OTEL_RL_AGENT=f"srun-{launcher.replace(' ', '')}-{rank}")
        if launcher == "slurm":
            env.update(SLURM_NODEID=str(rank), SLURM_LOCALID="0", SLURM_TASKS_PER_NODE="1(x2)", SLURM_PROCID=str(rank))
        own_shm = "mount -t tmpfs tmpfs /dev/shm && " if launcher == "one host name" and rank else ""  # a machine of its own memory
        script = f'hostname {host} && {own_shm}exec "$@"'
        namespaces = ["--uts", "--mount"] if own_shm else ["--uts"]
        launched.append(subprocess.Popen(["unshare", *namespaces, "sh", "-c", script, "sh", sys.executable, "-c", SRUN_STYLE, str(run_dir)],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    outputs = [process.communicate(timeout=120) for process in launched]
    assert [process.returncode for process in launched] == [0] * len(hosts), [err for _, err in outputs]
    machines = [out.strip().splitlines()[-1] for out, _ in outputs]
    if launcher == "slurm":
        assert machines == ["0", "1"]
    elif launcher == "ranks only":  # this machine's /dev/shm is theirs: the same id
        assert machines == ["None", str(host_machine("hostB", machine_id()))]
    else:  # two machines named "node": each its own, never folded into one
        assert machines[0] == "None" and "None" not in machines[1:] and machines[1] != machines[2], machines
    parts = sorted(p.name for p in run_dir.glob("*.perfetto-trace"))
    assert len(parts) == len(hosts) and len(set(parts)) == len(hosts), parts  # one part per machine, never one file for two
    model, _ = read_trace(run_dir)
    learning = {s.process for s in model.slices if s.name == "Learning"}
    assert len(learning) == len(hosts)  # every machine's learner, read as one job
    report = analyze(run_dir, engine="python")
    assert report.timelines["learner"].cycles == 30 * len(hosts)


def test_slurm_machines_of_different_sizes_place_every_rank(tmp_path):
    """``SLURM_TASKS_PER_NODE=2,1``: two ranks on one machine, one on the other; each rank placed, each machine its part."""
    from otel_rl.readers.analysis import analyze, read_trace

    run_dir = tmp_path / "srun"
    launched = []
    for rank, (host, node, local) in enumerate((("hostA", 0, 0), ("hostA", 0, 1), ("hostB", 1, 0))):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "SLURM_", "GROUP_RANK", "LOCAL_")) or k == "OTEL_RL_RUN_DIR"}
        env.update(RANK=str(rank), WORLD_SIZE="3", OTEL_RL_AGENT=f"srun-sizes-{rank}", SLURM_NODEID=str(node), SLURM_LOCALID=str(local),
                   SLURM_TASKS_PER_NODE="2,1", SLURM_PROCID=str(rank))  # fmt: skip
        script = f'hostname {host} && exec "$@"'
        launched.append(subprocess.Popen(["unshare", "--uts", "sh", "-c", script, "sh", sys.executable, "-c", SRUN_STYLE, str(run_dir)],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    outputs = [process.communicate(timeout=120) for process in launched]
    assert [process.returncode for process in launched] == [0, 0, 0], [err for _, err in outputs]
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == ["0", "0", "1"]  # the machine each rank is on
    model, _ = read_trace(run_dir)
    assert len({s.process for s in model.slices if s.name == "Learning"}) == 3  # every rank's learner, in one job
    assert analyze(run_dir, engine="python").timelines["learner"].cycles == 90

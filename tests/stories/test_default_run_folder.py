"""A run given no folder still keeps its records: ``runs/<algorithm>/<run id>``, one folder for every rank of a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from otel_rl import read
from ports import free_port

_LOOP = textwrap.dedent(
    """
    import os, sys
    import otel_rl
    options = eval(sys.argv[1]) if len(sys.argv) > 1 else {}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
    tel = otel_rl.init(algorithm="ppo", panel=False, **options)
    with tel.run():
        for i in range(20):
            with tel.iteration(i, env_steps=(i + 1) * 8):
                with tel.phase("learning"):
                    pass
            tel.scalars({"Loss/critic": 0.5 + i})
        if world > 1:
            tel.log_window({"Loss/critic": 1.0})
            dist.all_reduce(torch.ones(1))
    tel.close()
    if world > 1:
        dist.destroy_process_group()
    """
)


def _environment(**extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "OTEL_RL_RUN_DIR"}
    environment.update(extra, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return environment


def _run(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    script = cwd / "loop.py"
    script.write_text(_LOOP)
    result = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=_environment(**extra),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_a_run_given_no_folder_records_into_one_of_its_own_and_says_where(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    folders = sorted((tmp_path / "runs" / "ppo").iterdir())
    assert len(folders) == 2  # two runs, two folders: a timestamp and a random suffix each
    for folder, result in zip(folders, sorted([first, second], key=lambda r: r.stderr)):
        assert {"metrics.jsonl", "trace.perfetto-trace", "run_summary.json", "run_config.json"} <= {p.name for p in folder.iterdir()}
        assert json.loads((folder / "run_summary.json").read_text())["run_id"] == folder.name
        assert f"run {folder.name} records into runs/ppo/{folder.name}" in result.stderr
    assert sorted(read.scalars(folders[0])["Loss/critic"].dropna()) == [0.5 + i for i in range(20)]


@pytest.mark.parametrize("how", ["run_dir=False", "OTEL_RL_RUN_DIR=off"])
def test_a_run_told_to_keep_no_folder_writes_none(tmp_path, how):
    if how == "run_dir=False":
        result = _run(tmp_path, "{'run_dir': False}")
    else:
        result = _run(tmp_path, OTEL_RL_RUN_DIR="off")
    assert list(tmp_path.iterdir()) == [tmp_path / "loop.py"]
    assert "records into" not in result.stderr


def test_the_folder_can_be_given_by_the_environment_and_the_run_id_names_the_default(tmp_path):
    _run(tmp_path, OTEL_RL_RUN_DIR=str(tmp_path / "team" / "exp"))
    assert (tmp_path / "team" / "exp" / "metrics.jsonl").is_file()
    _run(tmp_path, OTEL_RL_RUN_ID="sweep-7")
    assert json.loads((tmp_path / "runs" / "ppo" / "sweep-7" / "run_summary.json").read_text())["run_id"] == "sweep-7"


def test_a_folder_variable_naming_a_file_is_one_warning_and_the_default_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("not a folder")
    result = _run(tmp_path, OTEL_RL_RUN_DIR=str(tmp_path / "notes.txt"))
    said = [line for line in result.stderr.splitlines() if "OTEL_RL_RUN_DIR" in line]
    assert len(said) == 1 and "is a file" in said[0] and "Traceback" not in result.stderr, result.stderr
    (folder,) = (tmp_path / "runs" / "ppo").iterdir()
    assert sorted(read.scalars(folder)["Loss/critic"].dropna()) == [0.5 + i for i in range(20)]
    assert (tmp_path / "notes.txt").read_text() == "not a folder"


def test_every_rank_of_a_torchrun_job_takes_one_default_folder(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--master-port", str(port), str(script)],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folders = list((tmp_path / "runs" / "ppo").iterdir())
    assert len(folders) == 1, folders  # torchrun's rendezvous id names it: both ranks write there
    phases = read.phases(folders[0])
    print(phases.groupby("process").size())
    assert len(set(phases["process"])) == 2 and len(phases) == 40  # each rank's 20 iterations


def test_a_job_whose_ranks_share_no_id_records_no_folder_and_says_so_once(tmp_path):
    result = _run(tmp_path, "{'rank': 0, 'world_size': 2}")
    assert not (tmp_path / "runs").exists()
    assert result.stderr.count("given no run_dir records nothing to disk") == 1


_HELD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    import otel_rl
    dist.init_process_group("gloo")
    tel = otel_rl.init(algorithm="ppo", panel=False)
    release, iterations = Path(sys.argv[1]), int(sys.argv[2])
    with tel.run():
        i = 0
        while i < iterations or (iterations == 0 and not release.exists()):  # 0: until the test lets this job go
            with tel.iteration(i, env_steps=(i + 1) * 8):
                with tel.phase("learning"):
                    time.sleep(0.01)
            i += 1
            if i > 20_000:
                break
        dist.all_reduce(torch.ones(1))
    tel.close()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow  # two torchrun jobs of two ranks each
def test_two_jobs_at_once_under_one_slurm_job_id_each_get_a_folder_of_their_own(tmp_path):
    script = tmp_path / "held.py"
    script.write_text(_HELD)
    release = tmp_path / "release"
    environment = _environment(SLURM_JOB_ID="4242")
    environment.pop("TORCHELASTIC_RUN_ID", None)

    def job(iterations: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(free_port()),
                   str(script), str(release), str(iterations)]  # fmt: skip
        return subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first_folder = tmp_path / "runs" / "ppo" / "slurm-4242"
    first = job(0)
    try:
        deadline = time.monotonic() + 120
        while not (first_folder / "metrics.jsonl").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[0][-3000:]
        second = job(20)  # while the first job holds its folder
        out, _ = second.communicate(timeout=180)
        assert second.returncode == 0, out[-3000:]
    finally:
        release.touch()
        first_out, _ = first.communicate(timeout=180)
    assert first.returncode == 0, first_out[-3000:]
    assert "RunFolderInUse" not in out
    assert sorted(p.name for p in (tmp_path / "runs" / "ppo").iterdir()) == ["slurm-4242", "slurm-4242-2"]
    assert "this run is slurm-4242-2" in out
    for folder, run_id in ((first_folder, "slurm-4242"), (first_folder.with_name("slurm-4242-2"), "slurm-4242-2")):
        phases = read.phases(folder)
        assert len(set(phases["process"])) == 2, (folder, phases.groupby("process").size())  # both ranks of the job, none of the other's
        runs = {json.loads(line)["run_id"] for line in (folder / "metrics.jsonl").read_text().splitlines()}
        assert runs == {run_id}
        assert not list(folder.glob(".otel-rl-*"))  # the notes that led the ranks went with their rank 0's close
    second_counts = read.phases(first_folder.with_name("slurm-4242-2")).groupby("process").size()
    assert set(second_counts) == {20}

"""Videos and images cost training one bounded copy: the agent encodes and writes them, and says what it could not.

Real multi-threaded OpenBLAS beside real CartPole videos, the user's own
``import imageio.v2`` right after a call, lists measured before any copy, the
training process's own peak memory (``ru_maxrss``), processes killed with
SIGKILL while videos are written, and a real filesystem that fills.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from disks import tmpfs

import otel_rl
from otel_rl.base.user_dir import private_dir
from otel_rl.run import media
from otel_rl.training.media_out import MediaOut, Refused

BLAS_LOOP = """
import sys
import numpy as np
import gymnasium as gym
import otel_rl

run_dir, agent = sys.argv[1], sys.argv[2]
env = gym.make("CartPole-v1", render_mode="rgb_array")
env.reset(seed=0)
frames = []
for _ in range(60):
    frames.append(env.render())
    if env.step(env.action_space.sample())[2]:
        env.reset()
tel = otel_rl.init(run_dir=run_dir, run_id="blas", panel=False, quiet=True, system_metrics_interval_s=0, agent=agent)
rng = np.random.default_rng(0)
W = rng.standard_normal((384, 384)) / 20
x = rng.standard_normal((384, 384))
with tel.run():
    for i in range(40):
        with tel.iteration(i, env_steps=i):
            for _ in range(20):
                x = np.tanh(x @ W)  # multi-threaded OpenBLAS on the training thread, while the videos are written
        if i % 8 == 0:
            tel.video("Media/play", frames, fps=30, step=i)
tel.close()
print("done")
"""

MEMORY = """
import json, resource, sys, time
import numpy as np
import otel_rl

run_dir, agent, what = sys.argv[1], sys.argv[2], sys.argv[3]
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if what == "float":
    frames = np.random.default_rng(0).random((40, 480, 640, 3), dtype=np.float32)  # 141 MiB of floats from 0 to 1
    size = frames.nbytes
else:
    frames = [np.zeros((720, 1280, 3), np.uint8) for _ in range(600)]  # 1.5 GiB as a list (pages never touched)
    size = sum(f.nbytes for f in frames)
tel = otel_rl.init(run_dir=run_dir, run_id="m", panel=False, quiet=True, system_metrics_interval_s=0, agent=agent,
                   shutdown_timeout_s=120)
with tel.run():
    with tel.iteration(0, env_steps=1):
        pass
    before = peak()
    start = time.perf_counter()
    tel.video("Media/play", frames, fps=30)
    call_s = time.perf_counter() - start
tel.close()
print(json.dumps({"size": size, "extra": peak() - before, "call_s": call_s, "dropped": tel.stats()["dropped"]["media"]}))
"""


def _run(tmp_path: Path, script: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    path = tmp_path / "loop.py"
    path.write_text(script)
    try:
        return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the loop never ended (it hung): {exc}")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _named_files_only(run_dir: Path, records: list[dict]) -> None:
    """Every file in ``media/`` is one a record names, whole (no ``.part``, no empty file)."""
    named = {r["path"] for r in records if r["kind"] == "media"}
    present = {f"media/{p.name}" for p in (run_dir / "media").iterdir() if p.is_file()} if (run_dir / "media").is_dir() else set()
    assert present == named, (present, named)
    assert all((run_dir / path).stat().st_size > 0 for path in named)


def _handoffs_left(run_id: str) -> list[Path]:
    return [p for p in private_dir().rglob(f"*{media.HANDOFF_MARK}*") if p.name.startswith(run_id)]


@pytest.mark.slow  # real BLAS threads beside real videos: pytest -m "not slow" leaves it out
@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_loop_in_multithreaded_blas_beside_real_videos_runs_to_its_end(tmp_path, agent):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    path = tmp_path / "loop.py"
    path.write_text(BLAS_LOOP)
    try:
        done = subprocess.run([sys.executable, str(path), str(run_dir), agent], capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("training stopped for good beside its videos (a fork inside OpenBLAS's call)")
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    records = _records(run_dir)
    videos = [r for r in records if r["kind"] == "media"]
    assert [v["step"] for v in videos] == [0, 8, 16, 24, 32] and all(v["frames"] == 60 for v in videos)
    assert (videos[0]["width"], videos[0]["height"]) == (600, 400)
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"
    _named_files_only(run_dir, records)


def test_the_users_own_import_right_after_a_call_finds_no_import_of_ours_under_way(tmp_path):
    script = """
import sys
import numpy as np
import otel_rl

tel = otel_rl.init(run_dir=sys.argv[1], run_id="imp", panel=False, quiet=True, system_metrics_interval_s=0, agent=sys.argv[2])
at_init = set(sys.modules)
with tel.run():
    tel.image("Media/map", np.linspace(0, 1, 400).reshape(20, 20))
    tel.video("Media/play", np.zeros((4, 16, 16, 3), np.uint8))
    ours = sorted(set(sys.modules) - at_init)  # imported since init() returned
    import imageio.v2  # the user's own, at once
    imageio.v2.imwrite("mine.png", np.zeros((4, 4), np.uint8))
tel.close()
print("imported before:", ours)
"""
    for n, agent in enumerate(["process", "thread", "process"]):
        run_dir = tmp_path / f"run{n}"
        done = _run(tmp_path, script, str(run_dir), agent)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "imported before: []" in done.stdout  # nothing imported by the training process once init() returned
        assert sorted(r["key"] for r in _records(run_dir) if r["kind"] == "media") == ["Media/map", "Media/play"]


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_list_past_the_bound_is_refused_before_anything_is_copied(tmp_path, agent):
    done = _run(tmp_path, MEMORY, str(tmp_path / "run"), agent, "list")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["size"] > 1.5e9 and out["dropped"] == 1
    assert out["extra"] < 64 << 20, out  # no frame was copied (or even read)
    assert done.stderr.count("dropped: 16 items or 512 MiB of frames wait to be written") == 1


@pytest.mark.slow  # a 141 MiB video encoded: pytest -m "not slow" leaves it out
@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_float_video_costs_the_training_process_at_most_one_copy(tmp_path, agent):
    run_dir = tmp_path / "run"
    done = _run(tmp_path, MEMORY, str(run_dir), agent, "float")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["dropped"] == 0
    assert out["extra"] <= out["size"] * 1.1, out  # the frames once more at most (here the copy is in shared memory)
    (video,) = [r for r in _records(run_dir) if r["kind"] == "media"]
    assert (video["frames"], video["width"], video["height"]) == (40, 640, 480)
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(run_dir / video["path"]))
    next(reader)
    assert sum(1 for _ in reader) == 40
    assert not _handoffs_left("m")


def test_a_training_process_killed_right_after_its_videos_still_has_them_written(tmp_path):
    run_dir = tmp_path / "run"
    script = """
import os, signal, sys
import numpy as np
import otel_rl

tel = otel_rl.init(run_dir=sys.argv[1], run_id="kill", panel=False, quiet=True, system_metrics_interval_s=0)
rng = np.random.default_rng(0)
with tel.run():
    for i in range(3):
        with tel.iteration(i, env_steps=i):
            pass
        tel.video("Media/play", rng.integers(0, 255, (60, 120, 160, 3), dtype=np.uint8), fps=30, step=i)
    os.kill(os.getpid(), signal.SIGKILL)
"""
    done = _run(tmp_path, script, str(run_dir))
    assert done.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the agent goes on: it writes the videos, then ends the run as killed
        lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
        if lines and json.loads(lines[-1]).get("status") == "killed":
            break
        time.sleep(0.2)
    records = _records(run_dir)
    assert records[-1]["status"] == "killed"
    assert [r["step"] for r in records if r["kind"] == "media"] == [0, 1, 2]
    _named_files_only(run_dir, records)
    assert not _handoffs_left("kill")


@pytest.mark.slow  # noise videos encoded, an agent killed and replaced: pytest -m "not slow" leaves it out
def test_an_agent_killed_while_it_encodes_leaves_no_half_file_and_loses_nothing_unsaid(tmp_path):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, run_id="agentkill", panel=False, quiet=True, system_metrics_interval_s=0, shutdown_timeout_s=60)
    rng = np.random.default_rng(0)
    with tel.run():
        for i in range(4):  # noise encodes slowly: the agent is busy with them for a while
            tel.video("Media/noise", rng.integers(0, 255, (90, 240, 320, 3), dtype=np.uint8), fps=30, step=i)
        deadline = time.monotonic() + 60
        while not list((run_dir / "media").glob("*.part")) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = tel.stats()["agent_pid"]
        assert pid and list((run_dir / "media").glob("*.part")), "the agent never started encoding"
        os.kill(pid, signal.SIGKILL)
        for i in range(4, 6):
            with tel.iteration(i, env_steps=i):
                time.sleep(0.5)  # the watcher starts a new agent meanwhile
    tel.close()
    records = _records(run_dir)
    written = [r["step"] for r in records if r["kind"] == "media"]
    lost = [r["attributes"]["step"] for r in records if r["kind"] == "event" and r["name"] == media.EVENT_DROPPED]
    assert sorted(set(written) | set(lost)) == [0, 1, 2, 3] and len(written) == len(set(written)), (written, lost)
    _named_files_only(run_dir, records)
    assert not list((run_dir / "media").glob(".*"))  # the dead agent's part file went too
    assert not _handoffs_left("agentkill")


@pytest.fixture
def media_disk(tmp_path):
    """The run folder's ``media/`` on a real 1 MiB filesystem (tmpfs)."""
    with tmpfs(tmp_path / "run" / "media", "1m") as mount:
        yield mount


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_disk_that_fills_loses_a_video_by_name_and_leaves_no_empty_file(tmp_path, media_disk, agent, caplog):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, run_id="full", panel=False, quiet=True, system_metrics_interval_s=0, agent=agent)
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.run():
        tel.image("Media/before", np.zeros((8, 8, 3), np.uint8), step=1)
        tel.video("Media/noise", rng.integers(0, 255, (40, 240, 320, 3), dtype=np.uint8), fps=30, step=2)  # several MiB of noise
        tel.image("Media/after", np.zeros((8, 8, 3), np.uint8), step=3)  # the room the video took is free again
    tel.close()
    records = _records(run_dir)
    assert sorted(r["key"] for r in records if r["kind"] == "media") == ["Media/after", "Media/before"]
    (lost,) = [r for r in records if r["kind"] == "event" and r["name"] == media.EVENT_DROPPED]
    assert lost["attributes"] == {"key": "Media/noise", "type": "video", "step": 2, "reason": "the disk is full"}
    assert tel.stats()["dropped"]["media"] == 1
    _named_files_only(run_dir, records)
    assert not list(media_disk.glob(".*"))
    if agent == "thread":  # the agent's warnings reach this process's log when it serves here
        said = [r.getMessage() for r in caplog.records if "Media/noise" in r.getMessage()]
        assert said == ["otel-rl: video 'Media/noise' not written: the disk is full"]


def test_what_waits_to_be_handed_over_is_bounded_and_counted(tmp_path):
    taken = []
    out = MediaOut(tmp_path / "shm" / "run-learner-0-1-ab", None, lambda request: taken.append(request) or True)
    frame = np.zeros((2, 4, 4, 3), np.uint8)
    meta = {"kind": "video", "key": "Media/x", "fps": 10.0, "step": 0, "caption": None, "time_ns": 1}
    for _ in range(media.MAX_PENDING):
        out.hand(meta, frame)
    with pytest.raises(Refused, match="16 items"):
        out.hand(meta, frame)  # no agent took any: the seventeenth waits for none
    assert out.refused == 1 and out.held() == media.MAX_PENDING and len(taken) == media.MAX_PENDING
    header, offset = media.read_header(Path(taken[0]["handoff"]).read_bytes())
    assert header["shape"] == [2, 4, 4, 3] and header["dtype"] == "uint8" and Path(taken[0]["handoff"]).stat().st_size == offset + frame.nbytes
    for request in taken:  # the agent takes them: room again
        os.unlink(request["handoff"])
    out.hand(meta, frame)
    with pytest.raises(Refused, match="512 MiB"):
        out.hand(meta, [np.zeros((720, 1280, 3), np.uint8)] * 200)  # 527 MiB as a list: refused from its measure
    full = MediaOut(tmp_path / "shm2" / "run-learner-0-1-cd", None, lambda request: False)
    with pytest.raises(Refused, match="ring is full"):
        full.hand(meta, frame)
    assert full.held() == 0 and not list((tmp_path / "shm2").iterdir())  # no handoff file that no request names


def test_handoff_files_whose_producer_and_agent_died_are_removed_by_the_next_producer(tmp_path):
    from otel_rl.agent import directory

    folder = tmp_path / "agents"
    agent = folder / "run-1-ab"
    agent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    orphan = agent / f"r-learner-0-{dead}-ab{media.HANDOFF_MARK}1"
    live = agent / f"r-learner-0-{os.getpid()}-cd{media.HANDOFF_MARK}1"
    for path in (orphan, live):
        path.write_bytes(media.handoff_header({"kind": "video"}))
        os.utime(path, (time.time() - 120, time.time() - 120))
    removed, _ = directory.tidy(folder)
    assert orphan in removed and not orphan.exists() and live.exists()

"""Misuse and hostile input cost only themselves: each test makes the mistake, then counts what still arrived."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from fault_servers import HtmlPage

import otel_rl


def jsonl(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_integers_past_64_bits_in_scalars_are_written_as_floats(tmp_path, agent):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, agent=agent, system_metrics_interval_s=0)
    tel.scalars({"Loss/critic": 2**70, "Loss/actor": 3})
    tel.scalars({"Loss/critic": 2**70, "Loss/actor": 0.5})
    tel.close()
    values = [r["values"] for r in jsonl(tmp_path) if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert values == [{"Loss/critic": float(2**70), "Loss/actor": 3}, {"Loss/critic": float(2**70), "Loss/actor": 0.5}]
    assert all(type(v["Loss/critic"]) is float for v in values)


def test_run_after_close_is_a_quiet_no_op(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run(total_steps=10):
            tel.scalars({"Loss/critic": 2.0})
        with tel.run():
            pass
    assert sum("run() entered after close()" in r.getMessage() for r in caplog.records) == 1
    assert [r["status"] for r in jsonl(tmp_path) if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_a_service_answering_200_with_an_html_page_has_delivered_nothing(tmp_path, caplog):
    page = HtmlPage()
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            tel = otel_rl.init(run_dir=tmp_path / "run", jsonl=True, motrix_url=page.url, agent="thread", system_metrics_interval_s=0)
            with tel.run():
                for i in range(50):
                    tel.scalars({"Loss/critic": float(i)})
            tel.close()
        warnings = [r.getMessage() for r in caplog.records if "not a motrix.metrics/v1 answer" in r.getMessage()]
        assert len(warnings) == 1 and "text/html" in warnings[0]
        assert tel.stats()["dropped"]["http"] >= 50  # not counted as delivered: the JSONL keeps them for backfill
        assert len([r for r in jsonl(tmp_path / "run") if r["kind"] == "scalars"]) == 50
        backfill = subprocess.run(
            [sys.executable, "-m", "otel_rl.cli", "backfill", str(tmp_path / "run"), "--url", page.url],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        page.stop()
    assert backfill.returncode != 0 and "new" not in backfill.stdout
    assert "not a motrix.metrics/v1 answer" in backfill.stderr and "Traceback" not in backfill.stderr


HOLDER = """
import sys, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], jsonl=True, trace_enabled=True, resume=sys.argv[2] == "resume", system_metrics_interval_s=0)
with tel.run():
    for i in range(200):
        with tel.iteration(i, env_steps=i), tel.phase("learning"):
            pass
        tel.scalars({"Loss/critic": float(i)})
        if i == 100:
            print("holding", flush=True)
            sys.stdin.readline()
tel.close()
"""


@pytest.mark.parametrize("mode", ["new", "resume"])
def test_a_second_process_on_a_run_folder_in_use_moves_on_or_is_refused_and_costs_the_first_nothing(tmp_path, mode):
    """A new run takes the next free name (as a script run twice does); a second resume of the same run is refused."""
    from otel_rl.readers.analysis import protobuf_engine, trace_files

    run_dir = tmp_path / "shared"
    if mode == "resume":  # a run to resume, twice at once
        subprocess.run([sys.executable, "-c", HOLDER, str(run_dir), "new"], input="\n", text=True, check=True, timeout=120)
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "holding"
        if mode == "resume":
            with pytest.raises(otel_rl.RunFolderInUse, match=f"in use by process {first.pid}"):
                otel_rl.init(run_dir=run_dir, jsonl=True, trace_enabled=True, resume=True)
        else:
            second = otel_rl.init(run_dir=run_dir, jsonl=True, trace_enabled=True, system_metrics_interval_s=0)
            assert second.config.run_dir == tmp_path / "shared-2" and second.run_id == "shared-2"
            second.close()
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
    runs = 2 if mode == "resume" else 1
    steps = [r["values"]["Loss/critic"] for r in jsonl(run_dir) if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps == [float(i) for i in range(200)] * runs  # each writer's records once, not interleaved with another's
    assert [r["status"] for r in jsonl(run_dir) if r["kind"] == "run"] == ["pending", "running", "finished"] * runs
    model = protobuf_engine.read(trace_files(run_dir))
    assert sum(s.name == "Learning" for s in model.slices) == 200 * runs
    # Once the first has ended, the folder is free again.
    otel_rl.init(run_dir=run_dir, resume=True, system_metrics_interval_s=0).close()


def _misnest(tel, how: str) -> None:
    """One phase misused as ``how`` says, before the run's normal iterations."""
    learning, inference = tel.phase("learning"), tel.phase("inference")
    if how == "swapped":
        learning.__enter__()
        inference.__enter__()
        learning.__exit__(None, None, None)
        inference.__exit__(None, None, None)
    elif how == "abandoned":  # an exception swallowed between __enter__ and __exit__
        try:
            learning.__enter__()
            raise RuntimeError("lost")
        except RuntimeError:
            pass
    elif how == "generator":  # a generator abandoned inside its phase
        def steps():
            with tel.phase("replay_sample"):
                yield 1
                yield 2
        stepper = steps()
        next(stepper)
        del stepper


@pytest.mark.parametrize("implementation", ["c", "python"])
@pytest.mark.parametrize("agent", ["process", "thread"])
@pytest.mark.parametrize("how", ["swapped", "abandoned", "generator"])
def test_a_misnested_or_abandoned_phase_costs_only_itself(tmp_path, monkeypatch, caplog, implementation, agent, how):
    from otel_rl.readers.analysis import protobuf_engine, trace_files

    if implementation == "python":
        monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, trace_enabled=True, agent=agent, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run():
            _misnest(tel, how)
            for i in range(200):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("inference"):
                        pass
                    with tel.phase("learning"):
                        pass
        assert tel.flush(30.0)
        misused = tel.stats()["dropped"]["phase_misuse"]
        tel.close()
    model = protobuf_engine.read(trace_files(tmp_path))
    slices = [s.name for s in model.slices]
    assert slices.count("Learning") == 200 + (how == "swapped") and slices.count("Inference") == 200
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 200 + (how == "swapped")
    perf = [r["values"] for r in jsonl(tmp_path) if r["kind"] == "scalars" and "Perf/learning_time" in r["values"]]
    assert perf and "Perf/learner_inference_ms" in perf[-1]
    if how == "swapped":  # one warning naming it, counted
        assert misused == 1 and sum("entered inside it, was still open" in r.getMessage() for r in caplog.records) == 1


class _Hostile:
    """A value whose own code must never run on the training thread: its __repr__ raises, or hangs."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def __repr__(self) -> str:
        if self.hang:
            import time

            time.sleep(600)
        raise RuntimeError("no repr for you")

    __str__ = __repr__


def _returns(call, timeout_s: float = 60.0) -> None:
    """``call()`` finished (a hang would hold the test until ``timeout_s``, then fail it)."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the call ran the value's own code and hung"
    assert not errors, errors


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_values_own_repr_never_runs_on_the_training_thread(tmp_path, agent):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, agent=agent, system_metrics_interval_s=0)
    config = {"lr": 0.1, "blob": "x" * 2_000_000}
    config["self"] = config  # a configuration that holds itself
    with tel.run(config=config):
        for hang in (False, True):
            _returns(lambda: tel.scalars({"Loss/critic": 1.0, "Loss/odd": _Hostile(hang), _Hostile(hang): 2.0}))
            _returns(lambda: tel.event("configured", algo=_Hostile(hang), ok=1))
        tel.scalars({"Loss/critic": 2.0})
    tel.close()
    found = jsonl(tmp_path)
    running = next(r for r in found if r["kind"] == "run" and r["status"] == "running")
    assert running["config"]["self"] == "<cycle>" and running["config"]["lr"] == 0.1
    assert [r["values"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]] == [{"Loss/critic": 1.0}] * 2 + [{"Loss/critic": 2.0}]
    events = [r["attributes"] for r in found if r["kind"] == "event" and r["name"] == "configured"]
    assert events == [{"algo": "<_Hostile object>", "ok": 1}] * 2


def test_a_huge_configuration_is_bounded_and_said_once(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, agent="thread", system_metrics_interval_s=0)
    wide = {f"k{i}": {f"j{j}": j for j in range(900)} for i in range(900)}  # 810,000 values
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run(config=wide):
            pass
    tel.close()
    running = next(r for r in jsonl(tmp_path) if r["kind"] == "run" and r["status"] == "running")
    flat = [v for inner in running["config"].values() if isinstance(inner, dict) for v in inner.values()]
    assert "<truncated>" in flat and len([v for v in flat if v != "<truncated>"]) < 110_000
    assert sum("holds more than" in r.getMessage() for r in caplog.records) == 1


def test_a_million_distinct_keys_cost_only_the_keys_over_the_cap_and_every_drop_is_named(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for call in range(1000):
            tel.scalars({f"Sweep/k{call}_{i}": float(i) for i in range(1000)} | {"Loss/critic": float(call)})
    assert tel.flush(120.0)
    dropped = tel.stats()["dropped"]
    tel.close()
    found = jsonl(tmp_path)
    reported: dict[str, int] = {}
    for r in found:
        if r["kind"] == "event" and r["name"] == "records_dropped":
            reported[r["attributes"]["queue"]] = reported.get(r["attributes"]["queue"], 0) + r["attributes"]["total"]
    assert reported.get("scalar_keys", 0) > 0  # the keys past the cap, named
    assert reported.get("scalars", 0) == dropped["scalars"]  # whole calls a full ring refused, named too
    kept = [r["values"]["Loss/critic"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert len(kept) == 1000 - dropped["scalars"] and kept == sorted(kept)  # a known key of every call that arrived


@pytest.mark.parametrize("implementation", ["c", "python"])
@pytest.mark.parametrize("agent", ["process", "thread"])
def test_many_threads_cost_the_main_thread_nothing_and_short_lived_ones_reuse_lanes(tmp_path, monkeypatch, implementation, agent):
    import threading

    from otel_rl.readers.analysis import protobuf_engine, trace_files

    if implementation == "python":
        monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, trace_enabled=True, agent=agent, system_metrics_interval_s=0)
    inference, env_step = tel.phase("inference"), tel.phase("env_step", "collector")

    def work(phase, times):
        for _ in range(times):
            with phase:
                pass

    def wave(threads: int) -> None:
        started = [threading.Thread(target=work, args=(env_step, 100)) for _ in range(threads)]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join()
        assert tel.flush(30.0)

    with tel.run():
        work(inference, 50)
        for _ in range(30):  # 180 short-lived threads, 6 at a time: each wave takes the lanes the last one left
            wave(6)
        reused = tel.stats()["dropped"]["phases"]
        wave(12)  # more at once than a segment has lanes (8): the threads beyond are counted, never silently lost
        for i in range(100):
            with tel.iteration(i, env_steps=i), tel.phase("learning"):
                pass
    assert tel.flush(30.0)
    dropped = tel.stats()["dropped"]["phases"]
    tel.close()
    slices = [s.name for s in protobuf_engine.read(trace_files(tmp_path)).slices]
    assert slices.count("Learning") == 100 and slices.count("Inference") == 50  # the main thread lost nothing
    assert reused == 0 and slices.count("Env Step") + dropped == 19_200
    reported = sum(r["attributes"]["total"] for r in jsonl(tmp_path) if r["kind"] == "event" and r["name"] == "records_dropped"
                   and r["attributes"]["queue"] == "phases")  # fmt: skip
    assert reported == dropped


def test_a_misspelt_option_or_agent_mode_is_refused_with_what_was_meant(monkeypatch, caplog):
    with pytest.raises(TypeError, match=r"unknown option 'tracee_enabled' \(did you mean 'trace_enabled'\?\)"):
        otel_rl.init(tracee_enabled=True)
    with pytest.raises(ValueError, match=r"agent='procss' is not a mode; did you mean 'process'\?"):
        otel_rl.init(agent="procss")
    monkeypatch.setenv("OTEL_RL_AGENT", "thred")
    with caplog.at_level(logging.WARNING):
        tel = otel_rl.init(system_metrics_interval_s=0)
    assert tel.stats()["agent"] == "process"  # the default, with one warning naming the variable
    assert sum("OTEL_RL_AGENT" in r.getMessage() for r in caplog.records) == 1
    tel.close()


def test_the_standard_kill_switch_wins_over_code(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert isinstance(otel_rl.init(run_dir=tmp_path / "run", enabled=True), otel_rl.NoOpTelemetry)
    assert not (tmp_path / "run").exists()


def test_a_run_folder_lock_is_removed_when_its_run_ends_and_a_stale_one_is_reused(tmp_path):
    from otel_rl.run import folder as run_folder

    run_dir = tmp_path / "run"
    lock = run_folder.lock_path(run_dir)
    tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0)
    assert lock.exists()
    tel.close()
    assert not lock.exists()  # lock files do not pile up over a machine's runs
    lock.write_text("4242")  # left by a killed process
    tel = otel_rl.init(run_dir=run_dir, resume=True, system_metrics_interval_s=0)
    assert lock.read_text() == str(os.getpid())
    with pytest.raises(otel_rl.RunFolderInUse):
        run_folder.claim(run_dir)
    tel.close()
    assert not lock.exists()


TWICE = """
import sys, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    for i in range(30):
        with tel.iteration(i, env_steps=8 * i):
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/critic": 0.5 * i})
tel.close()
"""


def test_a_script_run_twice_into_one_folder_leaves_two_runs_never_one_merged(tmp_path):
    from otel_rl import read

    run_dir = tmp_path / "exp"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    first = subprocess.run([sys.executable, "-c", TWICE, str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr
    before = (run_dir / "metrics.jsonl").read_bytes()
    second = subprocess.run([sys.executable, "-c", TWICE, str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert second.returncode == 0, second.stderr
    moved = tmp_path / "exp-2"
    said = second.stderr.splitlines()
    assert said[0] == f"otel-rl: {run_dir} holds run exp already; this run is exp-2, in {moved} (resume=True continues exp)"
    assert said[1].startswith(f"otel-rl: run exp-2 records into {moved} (")
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # the first run is left as it was
    for folder, run_id in ((run_dir, "exp"), (moved, "exp-2")):
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert {r["run_id"] for r in records} == {run_id}
        assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"]
    runs = read.runs(tmp_path)
    assert sorted(runs["run_id"]) == ["exp", "exp-2"]
    points = read.scalars(tmp_path, keys=["Loss/critic"])
    assert points.groupby("run_id").size().to_dict() == {"exp": 30, "exp-2": 30}
    # resume=True still continues the run of the folder it names.
    resumed = otel_rl.init(run_dir=run_dir, resume=True, quiet=True, system_metrics_interval_s=0)
    assert resumed.run_id == "exp" and resumed.config.run_dir == run_dir
    resumed.close()


def _records_of(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_dangling_link_or_a_file_where_the_fresh_folder_would_go_is_passed_over(tmp_path):
    """``exp`` holds an ended run, ``exp-2`` is a dangling link and ``exp-3`` a file: the new run goes to ``exp-4``, whole."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    run_dir = tmp_path / "exp"
    assert subprocess.run([sys.executable, "-c", TWICE, str(run_dir)], capture_output=True, timeout=120, env=env).returncode == 0
    (tmp_path / "exp-2").symlink_to(tmp_path / "nowhere")
    (tmp_path / "exp-3").write_text("not a folder")
    second = subprocess.run([sys.executable, "-c", TWICE, str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert second.returncode == 0 and "File exists" not in second.stderr, second.stderr
    assert f"this run is exp-4, in {tmp_path / 'exp-4'}" in second.stderr.splitlines()[0]
    records = _records_of(tmp_path / "exp-4")
    assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert sum(1 for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 30


def test_the_current_folder_used_twice_gives_the_second_run_a_sibling(tmp_path):
    """``run_dir='.'`` in a folder that holds a run: the new one goes beside it (``.`` has no name of its own to number)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    folder = tmp_path / "work"
    folder.mkdir()
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", TWICE, "."], capture_output=True, text=True, timeout=120, env=env, cwd=folder)
        assert result.returncode == 0, result.stderr
    assert [r["run_id"] for r in _records_of(folder)][:1] == ["work"] and {r["run_id"] for r in _records_of(tmp_path / "work-2")} == {"work-2"}


def test_runs_started_at_one_instant_onto_an_ended_runs_folder_each_get_a_folder_of_their_own(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    run_dir = tmp_path / "exp"
    assert subprocess.run([sys.executable, "-c", TWICE, str(run_dir)], capture_output=True, timeout=120, env=env).returncode == 0
    at_once = "import sys, time\nwhile time.time() < float(sys.argv[2]): pass\n" + TWICE
    start = time.time() + 5  # both started and importing first: they reach init() at the same instant
    launched = [subprocess.Popen([sys.executable, "-c", at_once, str(run_dir), str(start)], stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(2)]  # fmt: skip
    outputs = [process.communicate(timeout=120)[1] for process in launched]
    assert [process.returncode for process in launched] == [0, 0], outputs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "exp-2", "exp-3"]
    for name in ("exp-2", "exp-3"):
        records = _records_of(tmp_path / name)
        assert {r["run_id"] for r in records} == {name} and len({r["writer"] for r in records}) == 1  # one writer a folder
        assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_two_runs_started_at_once_through_a_link_and_its_folder_get_a_folder_each(tmp_path):
    """One run names ``link`` (a symbolic link to ``real``), the other ``real``, started at one instant: one folder
    each, never two lifecycles in one ``metrics.jsonl`` (the lock is the folder's real path's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    runs = [subprocess.Popen([sys.executable, "-c", TWICE, str(tmp_path / name)], stderr=subprocess.PIPE, text=True, env=env)
            for name in ("link", "real")]  # fmt: skip
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink())
    assert folders == ["real", "real-2"], folders
    for folder in folders:
        records = _records_of(tmp_path / folder)
        assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"], folder
        assert sum(1 for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 30

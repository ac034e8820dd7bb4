"""The motrix.metrics/v1 client: records, outputs, drop policy, faults and lifecycle, against real peers."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fault_servers import ScriptedIngest, SilentServer, refused_url
from locations import FIXTURES as SUPPORT_FIXTURES
from motrix_golden import golden_records

import otel_rl
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.core.batches import ScalarBatch
from otel_rl.formats import protocol
from otel_rl.outputs.motrix import scalar_lines
from otel_rl.outputs.motrix.delivery import retry_after_s
from otel_rl.outputs.motrix.record_queue import RecordQueue

FIXTURES = SUPPORT_FIXTURES / "metrics_v1"
TOKEN = "s3cr3t-t0ken-value"


def read_jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def train(tel, iterations: int = 20, scalars_keys: int = 40) -> list[float]:
    """A small instrumented loop; returns the duration of every scalars() call."""
    durations = []
    with tel.run(family="rl.offpolicy", total_steps=iterations * 8, num_envs=8, config={"lr": 1e-3}):
        for i in range(iterations):
            with tel.iteration(i, env_steps=(i + 1) * 8):
                with tel.phase("collector_wait"):
                    pass
                with tel.phase("learning"):
                    time.sleep(0.001)
            values = {f"Loss/k{j}": float(i * j) for j in range(scalars_keys)}
            start = time.perf_counter()
            tel.scalars(values)
            durations.append(time.perf_counter() - start)
        tel.event("checkpoint_saved", path="ckpt.pt")
    return durations


# -- the format -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(golden_records()))
def test_golden_fixtures(name):
    expected = json.loads((FIXTURES / f"{name}.json").read_text())
    assert golden_records()[name] == expected


def test_fixtures_follow_the_json_schema():
    batch = json.loads((FIXTURES / "batch.json").read_text())
    assert len(protocol.validate_batch(batch)) == len(golden_records())


def test_schema_rejects_bad_records_naming_the_field():
    good = golden_records()["scalars"]
    for change, field in (
        ({"seq": "7"}, "$.records[0].seq"),
        ({"kind": "gossip"}, "$.records[0].kind"),
        ({"values": {"Loss/critic": "high"}}, "$.records[0].values['Loss/critic']"),
    ):
        with pytest.raises(protocol.ProtocolError) as raised:
            protocol.validate_batch(protocol.batch([{**good, **change}]))
        assert raised.value.field == field
    with pytest.raises(protocol.ProtocolError) as raised:
        protocol.validate_batch({"protocol": "motrix.metrics/v2", "records": []})
    assert raised.value.field == "$.protocol"


# -- behaviour --------------------------------------------------------


def test_a_run_folder_gets_the_jsonl_file_unless_it_is_switched_off(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "default")
    tel.close()
    assert (tmp_path / "default" / "metrics.jsonl").exists()
    tel = otel_rl.init(run_dir=tmp_path / "off", jsonl=False)
    tel.close()
    assert not (tmp_path / "off" / "metrics.jsonl").exists()


def test_same_records_with_same_seq_in_file_and_service(tmp_path):
    server = ScriptedIngest()
    try:
        tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url, perf_interval_s=0.05)
        train(tel)
        tel.close()  # returns once every output is done (or its deadline passed)
    finally:
        server.stop()
    in_file = read_jsonl(tmp_path)
    by_key = {(r["writer"], r["seq"]): r for r in in_file}
    assert len(by_key) == len(in_file)  # seqs are unique per writer
    assert {(r["writer"], r["seq"]): r for r in server.accepted} == by_key
    kinds = [r["kind"] for r in in_file]
    assert kinds.count("run") == 3  # pending, running, finished
    statuses = [r["status"] for r in in_file if r["kind"] == "run"]
    assert statuses == ["pending", "running", "finished"]
    running = next(r for r in in_file if r.get("status") == "running")
    assert (running["family"], running["total_steps"], running["num_envs"]) == ("rl.offpolicy", 160, 8)
    assert running["config"] == {"lr": 1e-3} and "otel_rl" in running["versions"]
    scalars = [r for r in in_file if r["kind"] == "scalars" and "Loss/k1" in r["values"]]
    assert [r["axes"]["env_steps"] for r in scalars] == [(i + 1) * 8 for i in range(20)]
    assert all(r["step"] == r["axes"]["env_steps"] for r in scalars)
    perf = [r for r in in_file if r["kind"] == "scalars" and "Perf/iteration_time" in r["values"]]
    assert perf and all(r["axes"]["env_steps"] is not None for r in perf)
    assert all(0.001 <= r["values"]["Perf/learning_time"] < 1.0 for r in perf)
    assert all("Perf/learner_collector_wait_ms" in r["values"] for r in perf)
    assert len(perf) < 20  # bounded rate: windows, not one record per iteration
    request = server.requests[0]
    assert request["path"] == "/api/v1/ingest"
    assert request["headers"]["Content-Encoding"] == "gzip"
    assert request["headers"]["Content-Type"] == "application/json"
    assert "Authorization" not in request["headers"]


def test_token_is_only_in_the_authorization_header(tmp_path, caplog):
    server = ScriptedIngest(then=401)
    try:
        with caplog.at_level(logging.DEBUG):
            tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url, motrix_token=TOKEN)
            train(tel, iterations=3)
            tel.close()
    finally:
        server.stop()
    assert all(r["headers"]["Authorization"] == f"Bearer {TOKEN}" for r in server.requests)
    assert TOKEN not in (tmp_path / "metrics.jsonl").read_text()
    assert TOKEN not in repr(tel.config)
    assert all(TOKEN not in r.getMessage() and TOKEN not in (r.exc_text or "") for r in caplog.records)
    assert any("HTTP 401" in r.getMessage() for r in caplog.records)


def test_environment_configuration(tmp_path, monkeypatch, caplog):
    server = ScriptedIngest()
    monkeypatch.setenv("MOTRIX_METRICS_URL", server.url)
    monkeypatch.setenv("MOTRIX_METRICS_RUN_ID", "my-run")
    monkeypatch.setenv("MOTRIX_METRICS_PROJECT", "proj")
    monkeypatch.setenv("MOTRIX_METRICS_GROUP", "grp")
    monkeypatch.setenv("MOTRIX_METRICS_META", '["not", "an", "object"]')
    try:
        with caplog.at_level(logging.WARNING):
            tel = otel_rl.init(run_dir=tmp_path)
            tel.close()
    finally:
        server.stop()
    (pending,) = server.accepted
    assert (pending["run_id"], pending["project"], pending["group"], pending["meta"]) == ("my-run", "proj", "grp", {})
    assert sum("MOTRIX_METRICS_META" in r.getMessage() for r in caplog.records) == 1
    assert read_jsonl(tmp_path) == [pending]


def test_nonfinite_values_become_null_with_one_event_per_key(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True)
    tel.scalars({"Loss/critic": float("nan"), "Loss/actor": 1.0})
    tel.scalars({"Loss/critic": float("inf"), "Loss/actor": float("-inf")})
    tel.scalars({"Loss/critic": float("nan")})
    tel.close()
    records = read_jsonl(tmp_path)
    values = [r["values"] for r in records if r["kind"] == "scalars"]
    assert values == [{"Loss/critic": None, "Loss/actor": 1.0}, {"Loss/critic": None, "Loss/actor": None}, {"Loss/critic": None}]
    events = [r["attributes"]["key"] for r in records if r["kind"] == "event" and r["name"] == "nonfinite"]
    assert sorted(events) == ["Loss/actor", "Loss/critic"]


def test_numpy_values_convert(tmp_path):
    np = pytest.importorskip("numpy")
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True)
    tel.scalars({"Loss/critic": np.float32(0.5), "Train/mean_episode_length": np.int64(200), "Loss/nan": np.float64("nan")})
    tel.close()
    (scalars,) = [r for r in read_jsonl(tmp_path) if r["kind"] == "scalars"]
    assert scalars["values"] == {"Loss/critic": 0.5, "Train/mean_episode_length": 200, "Loss/nan": None}


# -- drop policy ------------------------------------------------------


def _item(kind: str, n: int) -> tuple[str, str]:
    return kind, json.dumps({"kind": kind, "seq": n})


def _seqs(items) -> list[int]:
    return [json.loads(line)["seq"] for _, line in items]


def test_full_queue_drops_oldest_scalars_only():
    drops = Drops()
    queue = RecordQueue(4, "test", drops)
    queue.put(*_item("run", 0))
    for n in range(1, 4):
        queue.put(*_item("scalars", n))
    queue.put(*_item("event", 4))  # full: the oldest scalars (1) makes room
    queue.put(*_item("scalars", 5))  # full: scalars 2 goes
    assert _seqs(queue.take()) == [0, 3, 4, 5]
    assert drops.by_kind("test") == {"scalars": 2}
    assert drops.take_report(force=True) == {"test": {"scalars": 2}} and drops.take_report(force=True) == {}


def test_lifecycle_records_are_bounded_by_count_and_bytes(caplog):
    drops = Drops()
    queue = RecordQueue(3, "test", drops)
    with caplog.at_level(logging.WARNING):
        for n in range(8):
            queue.put(*_item("event", n))
    assert len(queue) == 6  # twice the capacity, never more
    assert drops.by_kind("test") == {"event": 2}
    assert sum("lifecycle records" in r.getMessage() for r in caplog.records) == 1
    by_bytes = RecordQueue(100, "bytes", drops, lifecycle_bytes=120)  # two 58-byte records
    for n in range(10):
        by_bytes.put("run", json.dumps({"kind": "run", "seq": n, "config": "x" * 20}))
    assert len(by_bytes) == 2 and drops.by_kind("bytes") == {"run": 8}
    assert len(by_bytes.take()) == 2 and len(by_bytes) == 0
    by_bytes.put(*_item("run", 99))  # taking them freed their bytes
    assert len(by_bytes) == 1


def test_drops_are_counted_and_reported_as_one_event_per_queue(tmp_path):
    """A burst that overflows the live queue during an outage: the drops reach the service once it is back."""
    server = ScriptedIngest(answers=[(503, {"Retry-After": "3"})] * 2)
    try:
        tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url, system_metrics_interval_s=0)
        with tel.run():
            for chunk in range(12):  # paced so the pipeline keeps up: the live queue is what overflows
                for i in range(1000):
                    tel.scalars({"Loss/critic": float(i)})
                time.sleep(0.15)
        tel.flush(timeout_s=1)  # the agent's counts reach stats() after its next pass
        dropped = tel.stats()["dropped"]
        tel.close(timeout_s=15)
    finally:
        server.stop()
    assert dropped["http"] > 0
    reports = [r for r in server.accepted if r["kind"] == "event" and r["name"] == "records_dropped"]
    http = [r["attributes"] for r in reports if r["attributes"]["queue"] == "http"]
    assert http and sum(a["scalars"] for a in http) >= dropped["http"]
    assert len(http) <= 3  # one event per report period, not one per record
    statuses = [r["status"] for r in server.accepted if r["kind"] == "run"]
    assert statuses == ["pending", "running", "finished"]


def test_retry_after_parsing():
    assert retry_after_s("2") == 2.0
    assert retry_after_s("9999") == 60.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


# -- faults -----------------------------------------------------------


def _fault_server(kind: str):
    if kind == "silent":
        return SilentServer()
    if kind == "refused":

        class Refused:
            url = refused_url()

            def stop(self):
                pass

        return Refused()
    answers = {
        "slow": ScriptedIngest(delay_s=0.5),
        "400": ScriptedIngest(then=400),
        "401": ScriptedIngest(then=401),
        "413": ScriptedIngest(then=413),
        "429": ScriptedIngest(then=(429, {"Retry-After": "1"})),
        "500": ScriptedIngest(then=500),
        "503": ScriptedIngest(then=(503, {"Retry-After": "1"})),
    }
    server = answers.pop(kind)
    for other in answers.values():
        other.stop()
    return server


@pytest.mark.parametrize("kind", ["slow", "silent", "refused", "400", "401", "413", "429", "500", "503"])
def test_service_faults_never_reach_training(kind, tmp_path):
    server = _fault_server(kind)
    try:
        tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url, shutdown_timeout_s=2.0)
        durations = train(tel, iterations=30)
        started = time.monotonic()
        tel.close()
        close_s = time.monotonic() - started
    finally:
        server.stop()
    # close() waits for the outputs, never past its deadline.
    assert close_s < tel.config.shutdown_timeout_s + 0.5
    assert len(durations) == 30
    # The file holds everything whatever the service does, as soon as close() returns.
    kinds = [r["kind"] for r in read_jsonl(tmp_path)]
    assert kinds.count("scalars") >= 30 and kinds.count("run") == 3 and "event" in kinds


def test_service_recovering_within_the_retry_window_loses_no_lifecycle_record(tmp_path):
    server = ScriptedIngest(answers=[(503, {"Retry-After": "0"})] * 3 + [500, 502])
    try:
        tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url)
        train(tel, iterations=5)
        tel.event("warmup_done")
        tel.close(timeout_s=30)
    finally:
        server.stop()
    delivered = {(r["writer"], r["seq"]) for r in server.accepted}
    for rec in read_jsonl(tmp_path):
        if rec["kind"] in ("run", "event"):
            assert (rec["writer"], rec["seq"]) in delivered, rec


# -- disk faults ------------------------------------------------------


def _disk_fault(kind: str, run_dir: Path):
    """Make run_dir/metrics.jsonl misbehave for real; returns a cleanup function."""
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / "metrics.jsonl"
    if kind == "erroring":
        target.symlink_to("/dev/full")  # every write fails with ENOSPC
        return lambda: None
    if kind in ("stalled", "slow"):
        os.mkfifo(target)  # opening for writing blocks until a reader comes
        stop = threading.Event()

        def slow_reader():
            with open(target, "rb") as fifo:
                while not stop.is_set() and fifo.read(256):
                    time.sleep(0.05)

        if kind == "slow":
            threading.Thread(target=slow_reader, daemon=True).start()

        def release():
            stop.set()
            # Unblock a writer still waiting in open() so its thread can end.
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)

        return release
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["slow", "stalled", "erroring"])
def test_disk_faults_never_reach_training(kind, tmp_path, caplog):
    run_dir = tmp_path / "run"
    release = _disk_fault(kind, run_dir)
    try:
        with caplog.at_level(logging.WARNING):
            tel = otel_rl.init(run_dir=run_dir, jsonl=True, shutdown_timeout_s=2.0)
            train(tel, iterations=30)
            tel.flush(timeout_s=0.5)  # bounded even though the disk is not
            started = time.monotonic()
            tel.close()
            assert time.monotonic() - started < tel.config.shutdown_timeout_s + 0.5
    finally:
        release()
    if kind == "erroring":
        assert sum(f"cannot write {run_dir}" in r.getMessage() for r in caplog.records) == 1
    # The rest of telemetry carried on: the agent writes the summary within its own deadline, which may end
    # after the training process's close() returned (its outputs go on in the background).
    deadline = time.monotonic() + 10
    while not (run_dir / "run_summary.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run_dir / "run_summary.json").exists()


def test_unwritable_directory(tmp_path, caplog):
    blocker = Path("/proc") / f"otel-rl-{tmp_path.name}"  # no folder can be made there, not even by root
    with caplog.at_level(logging.WARNING):
        tel = otel_rl.init(run_dir=blocker / "run", jsonl=True)
        train(tel, iterations=5)
        tel.flush(timeout_s=3)  # the writer tries (and fails) now
        tel.close(timeout_s=0.5)
    assert sum(str(blocker / "run" / "metrics.jsonl") in r.getMessage() for r in caplog.records) == 1


def _unblock(fifo: Path) -> None:
    """Let a writer waiting in open() on ``fifo`` go on (its writes then fail: nobody reads)."""
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))


def test_a_full_jsonl_queue_waits_for_the_disk_and_gives_up_only_on_one_that_writes_nothing(tmp_path, monkeypatch, caplog):
    from otel_rl.base import loops
    from otel_rl.outputs.motrix.jsonl import JsonlWriter

    drops = Drops()
    writer = JsonlWriter(tmp_path / "metrics.jsonl", drops, capacity=10, interval_s=60.0)  # a queue of 10, written only when asked
    try:
        for n in range(1000):
            writer.submit([("scalars", json.dumps({"seq": n}))])
        writer.submit([("scalars", json.dumps({"seq": n})) for n in range(1000, 1025)])  # more than the queue holds at once
        assert writer.flush(Deadline(5.0))
    finally:
        writer.shutdown(Deadline(5.0))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1025)) and drops.totals() == {}

    # A disk that writes nothing (the file is a FIFO nobody reads: the writer's open() never returns).
    monkeypatch.setattr(loops, "STALL_S", 0.5)
    fifo = tmp_path / "stalled.jsonl"
    os.mkfifo(fifo)
    stalled_drops = Drops()
    stalled = JsonlWriter(fifo, stalled_drops, capacity=10, interval_s=60.0)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            began = time.monotonic()
            for n in range(100):
                stalled.submit([("scalars", json.dumps({"seq": n}))])
            waited = time.monotonic() - began
        # 10 in the round stuck in open(), 10 queued; the rest dropped and counted, after one wait of STALL_S.
        assert stalled_drops.by_kind("jsonl") == {"scalars": 80}
        assert 0.5 <= waited < 30
        assert sum("made no progress" in r.getMessage() for r in caplog.records) == 1
    finally:
        _unblock(fifo)
        stalled.shutdown(Deadline(2.0))


def test_a_jsonl_flush_wakes_the_writer_only_when_something_is_left_to_write(tmp_path):
    from otel_rl.outputs.motrix.jsonl import JsonlWriter

    class Counting(JsonlWriter):
        rounds = 0

        def run_once(self):
            Counting.rounds += 1
            super().run_once()

    writer = Counting(tmp_path / "metrics.jsonl", Drops(), interval_s=60.0)
    try:
        writer.submit([("scalars", '{"seq":1}'), ("scalars", '{"seq":2}')])
        assert writer.flush(Deadline(5.0)) and Counting.rounds == 1
        assert (tmp_path / "metrics.jsonl").read_text() == '{"seq":1}\n{"seq":2}\n'  # written when flush() returns
        assert writer.settled and writer.flush(Deadline(5.0)) and Counting.rounds == 1  # nothing left: no round
        writer.submit([("scalars", '{"seq":3}')])
        assert not writer.settled and writer.flush(Deadline(5.0)) and Counting.rounds == 2
        assert (tmp_path / "metrics.jsonl").read_text().endswith('{"seq":3}\n')
    finally:
        writer.shutdown(Deadline(5.0))


def test_lines_of_a_run_are_the_bytes_of_its_records():
    """The C line splicer and its Python twin give, byte for byte, orjson's encoding of each record's dictionary."""
    rng = np.random.default_rng(7)
    names = ("Loss/a", "Train/mean_reward", "custom/höhe ✓", "x" * 300, 'quote"and\\slash')
    values = rng.standard_normal((64, len(names))) * 10.0 ** rng.integers(-30, 30, (64, len(names)))
    values[0] = [0.0, -0.0, 1e16, 1e-5, 5e-324]
    values[1] = [1.7976931348623157e308, 123456789012345678.0, 0.1, 100.0, -1e-320]
    batch = ScalarBatch(
        names,
        rng.integers(0, 10**12, 64).astype(np.int64) + 1_764_650_000_123_456_789,
        values,
        [None if i % 3 == 0 else i for i in range(64)],
        [None if i % 5 == 0 else 2**62 + i for i in range(64)],
        [None if i % 7 == 0 else -i for i in range(64)],
        list(range(10**9, 10**9 + 64)),
    )
    assert scalar_lines.NATIVE  # the test command builds the extension
    made = scalar_lines.batch_lines("run-ü", "writer-1", batch, None)
    assert made == scalar_lines.batch_lines("run-ü", "writer-1", batch, None, native=False)
    for (kind, line), rec in zip(made, batch):
        expected = protocol.scalars_record("run-ü", "writer-1", rec.seq, rec.time_ns / 1e9, rec.axis_step, {"env_steps": rec.env_steps, "iteration": rec.iteration}, rec.values)
        assert kind == "scalars" and json.loads(line) == expected
    # A batch of ints and None is made record by record: the same bytes orjson gives.
    mixed = ScalarBatch(("Loss/a", "Loss/b"), np.array([1, 2], dtype=np.int64), np.array([[1, None], [2**62, 0.5]], dtype=object), [1, 2], [None, None], [None, None], [5, 6])
    assert [json.loads(line)["values"] for _, line in scalar_lines.batch_lines("r", "w", mixed, None)] == [{"Loss/a": 1, "Loss/b": None}, {"Loss/a": 2**62, "Loss/b": 0.5}]


def test_a_steady_loop_writes_the_same_jsonl_through_the_agent_as_in_process(tmp_path):
    """Both hosts read the same segment shape and write the same lines."""
    files = {}
    for agent in ("process", "off"):
        run_dir = tmp_path / agent
        tel = otel_rl.init(run_dir=run_dir, run_id="same-run", agent=agent, trace_enabled=False, system_metrics_interval_s=0)
        with tel.run():
            for i in range(300):
                with tel.iteration(i, env_steps=i * 4):
                    pass
                tel.scalars({"Loss/a": i / 7, "Loss/b": -1e16 * i, "Train/mean_reward": 2.0**-i}, step=i)
        tel.close()
        files[agent] = [r for r in read_jsonl(run_dir) if r["kind"] == "scalars" and not any(k.startswith("Perf/") for k in r["values"])]
    for records in files.values():
        for r in records:
            r.pop("ts"), r.pop("seq"), r.pop("writer")
    assert len(files["process"]) == 300 and files["process"] == files["off"]


@pytest.mark.parametrize("logs_its_own", [False, True])
def test_steps_per_second_are_derived_for_a_loop_that_logs_none(tmp_path, logs_its_own):
    """A run of one rank: Perf/total_fps from the learner's env steps and the time, in metrics.jsonl (and so the live
    stream), unless the loop logs its own."""
    tel = otel_rl.init(run_dir=tmp_path, perf_interval_s=0.2, system_metrics_interval_s=0)
    with tel.run():
        for i in range(150):  # 64 env steps every 10 ms at most: 6,400 steps/s or fewer
            with tel.iteration(i, env_steps=64 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.01)
            if logs_its_own:
                tel.scalars({"Perf/total_fps": 123.0})
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    fps = [r["values"]["Perf/total_fps"] for r in records if r["kind"] == "scalars" and "Perf/total_fps" in r["values"]]
    if logs_its_own:
        assert fps and set(fps) == {123.0}
    else:
        assert len(fps) >= 3 and 0.2 * 6400 < sorted(fps)[len(fps) // 2] < 1.3 * 6400, fps

"""The client keeps its promises on the ordinary input RL code hands it, against real services and real files.

Each test here reproduces a way records used to be lost (or training
disturbed) and checks that only the bad field is lost now, never a batch, a
thread or a run's records.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
from fault_servers import ScriptedIngest, SilentServer, TrickleServer

import otel_rl
from otel_rl.api import NoOpTelemetry
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.outputs.motrix.http_sender import HttpSender
from otel_rl.outputs.motrix.jsonl import JsonlWriter
from otel_rl.readers.server import IngestServer
from otel_rl.training.run_scope import failure_reason


class Algo(enum.Enum):
    SAC = "sac"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Optim:
    lr: float = 3e-4
    betas: tuple = (0.9, 0.999)


def hostile_values() -> dict:
    """What RL configs really hold: every kind of value the JSON encoder used to choke on."""
    return {
        "path": pathlib.Path("/data/runs"),
        "np_float": np.float32(0.5),
        "np_int": np.int64(7),
        "np_bool": np.bool_(True),
        "array": np.arange(3),
        "tensor": torch.tensor([1.0, 2.0]),
        "big_tensor": torch.zeros(5000),
        "algo": Algo.SAC,
        "level": Level.HIGH,
        "when": datetime.datetime(2026, 11, 30, 12, 0),
        "day": datetime.date(2026, 11, 30),
        "timeout": datetime.timedelta(minutes=2),
        ("lr", 0): "tuple key",
        1: "int key",
        "seeds": {3, 1, 2},
        "max_grad_norm": float("inf"),
        "target": float("nan"),
        "huge": 2**70,
        "optim": Optim(),
        "blob": b"\x00\x01",
        "object": object(),
        "surrogate": "a\ud800b",
        "long": "x" * 20_000,
    }


@pytest.fixture
def server(tmp_path):
    with IngestServer(tmp_path / "ingest.sqlite3") as srv:
        yield srv


def read_jsonl(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def stored(server, run_id: str) -> list[dict]:
    return server.storage.records(run_id)


# -- 1-5: values that are not plain JSON ------------------------------------------------


def test_config_meta_and_attributes_of_any_kind_lose_no_record(tmp_path, server):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, motrix_url=server.url, meta=hostile_values(), system_metrics_interval_s=0)
    with tel.run(config=hostile_values(), total_steps=np.int64(1000), num_envs=np.int32(8)):
        for i in range(3):
            with tel.iteration(i, env_steps=np.int64(8 * i)):
                with tel.phase("learning"):
                    pass
            tel.scalars({"Loss/critic": np.float32(0.25)})
            tel.event("checkpoint_saved", **{k: v for k, v in hostile_values().items() if isinstance(k, str)})
    tel.close()
    lines = read_jsonl(run_dir)
    held = stored(server, run_dir.name)
    assert {(r["writer"], r["seq"]) for r in held} == {(r["writer"], r["seq"]) for r in lines}  # nothing lost
    (running,) = [r for r in lines if r.get("status") == "running"]
    config = running["config"]
    assert config["path"] == "/data/runs" and config["np_float"] == 0.5 and config["np_int"] == 7
    assert config["np_bool"] is True and config["array"] == [0, 1, 2] and config["tensor"] == [1.0, 2.0]
    assert config["big_tensor"].startswith("Tensor(shape=[5000]")
    assert config["algo"] == "sac" and config["level"] == 3
    assert config["when"] == "2026-11-30T12:00:00" and config["day"] == "2026-11-30" and config["timeout"] == 120.0
    assert config["('lr', 0)"] == "tuple key" and config["1"] == "int key" and config["seeds"] == [1, 2, 3]
    assert config["max_grad_norm"] is None and config["target"] is None
    assert config["huge"] == str(2**70)  # the digits are kept
    assert config["optim"] == {"lr": 3e-4, "betas": [0.9, 0.999]}
    assert config["object"].startswith("<object object") and "\ud800" not in config["surrogate"]
    assert len(config["long"]) == 8192
    assert (running["total_steps"], running["num_envs"]) == (1000, 8)
    assert running["meta"]["path"] == "/data/runs"
    nonfinite = {r["attributes"]["key"] for r in lines if r["kind"] == "event" and r["name"] == "nonfinite"}
    assert {"config.max_grad_norm", "config.target", "meta.max_grad_norm", "event:checkpoint_saved.max_grad_norm"} <= nonfinite
    saved = [r for r in lines if r["kind"] == "event" and r["name"] == "checkpoint_saved"]
    assert len(saved) == 3 and saved[0]["attributes"]["when"] == "2026-11-30T12:00:00"
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_an_infinite_config_value_still_writes_the_file(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run(config={"max_grad_norm": float("inf")}):
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    lines = read_jsonl(tmp_path)
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_numpy_steps_are_integers_and_backfill_takes_them(tmp_path, server):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        with tel.iteration(np.int64(3), env_steps=np.int64(199)):
            pass
        tel.scalars({"Loss/critic": 1.0}, step=np.int64(199))
        tel.scalars({"Loss/critic": 2.0}, step=torch.tensor(200))
        tel.scalars({"Loss/critic": 3.0}, step=2**64)  # not an int64: ignored (one warning), the value kept
        with tel.iteration(2**70, env_steps=2**65):  # Python ints out of range: caught off the training thread
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/actor": 4.0})
    tel.close()
    scalars = [r for r in read_jsonl(run_dir) if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert [r["step"] for r in scalars] == [199, 200, 199]
    assert all(type(r["step"]) is int and r["axes"] == {"env_steps": 199, "iteration": 3} for r in scalars)
    (after,) = [r for r in read_jsonl(run_dir) if r["kind"] == "scalars" and "Loss/actor" in r["values"]]
    assert after["axes"] == {"env_steps": None, "iteration": None}
    totals = backfill(run_dir, server.url)
    assert totals["rejected"] == 0 and totals["accepted"] == totals["sent"]


def test_arrays_in_scalars_are_recorded_as_their_mean_and_named(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for _ in range(3):
            tel.scalars({"Loss/critic": np.array([1.0, 3.0]), "Loss/actor": torch.tensor([2.0, 4.0, 6.0]), "Loss/q": np.array([])})
    tel.close()
    records = read_jsonl(tmp_path)
    values = [r["values"] for r in records if r["kind"] == "scalars"]
    assert values == [{"Loss/critic": 2.0, "Loss/actor": 4.0}] * 3
    assert not [r for r in records if r["kind"] == "event" and r["name"] == "nonfinite"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'Loss/critic' is an array of shape (2,)" in m and "mean" in m for m in messages) == 1
    assert sum("'Loss/actor' is an array of shape (3,)" in m for m in messages) == 1
    assert sum("'Loss/q'" in m and "empty" in m for m in messages) == 1


def test_keys_that_are_not_strings_are_dropped_not_merged(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.scalars({1: np.float32(2.0), "1": 3.0, ("a", 1): 4.0, Algo.SAC: 5.0, "Loss/critic": 1.0})
        tel.scalars({1: 2.0, "Loss/critic": 1.0})
    tel.close()
    values = [r["values"] for r in read_jsonl(tmp_path) if r["kind"] == "scalars"]
    assert values == [{"custom/1": 3.0, "Loss/critic": 1.0}, {"Loss/critic": 1.0}]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("key 1 (int) is not a string" in m for m in messages) == 1
    assert sum("(tuple) is not a string" in m for m in messages) == 1


# -- 6-8: one bad record never costs its batch; lifecycle survives outages ---------------


def test_protocol_limits_are_kept_by_the_client(tmp_path, server):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, motrix_url=server.url, system_metrics_interval_s=0)
    long_key = "Loss/" + "k" * 400
    with tel.run():
        tel.scalars({long_key: 1.0, "Loss/" + "k" * 400 + "2": 2.0, "Loss/huge": 2**63, "Loss/ok": 1.0})
        tel.event("e" * 300, value=2**64)
        tel.event(12, value=1)
        tel.event("", value=1)
    tel.close()
    held = stored(server, run_dir.name)
    lines = read_jsonl(run_dir)
    assert len(held) == len(lines)
    (values,) = [r["values"] for r in lines if r["kind"] == "scalars" and "Loss/ok" in r["values"]]
    assert len(values) == 4 and all(len(k) <= 256 for k in values)  # shortened, still distinct
    assert values["Loss/huge"] == float(2**63)
    names = [r["name"] for r in lines if r["kind"] == "event" and r["name"] not in ("nonfinite", "records_dropped")]
    assert len(names) == 3 and all(0 < len(n) <= 256 for n in names) and "12" in names and "unnamed" in names
    assert [r["status"] for r in held if r["kind"] == "run"][-1] == "finished"


@pytest.mark.parametrize("name_field", [True, False])
def test_a_refused_record_costs_only_itself(tmp_path, name_field, caplog):
    refuse = lambda record: record.get("kind") == "scalars" and record["values"].get("Loss/poison") is not None  # noqa: E731
    server = ScriptedIngest(refuse=refuse, name_field=name_field)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            tel = otel_rl.init(run_dir=tmp_path, motrix_url=server.url, system_metrics_interval_s=0)
            with tel.run():
                for i in range(300):
                    tel.scalars({"Loss/critic": float(i), **({"Loss/poison": 1.0} if i in (17, 200) else {})})
            tel.close()
    finally:
        server.stop()
    sent = {(r["writer"], r["seq"]) for r in read_jsonl(tmp_path)}
    accepted = {(r["writer"], r["seq"]) for r in server.accepted}
    assert len(sent - accepted) == 2  # the two poisoned records, nothing else
    assert server.kinds().count("run") == 3  # pending, running, finished
    assert any("refused a scalars record" in r.getMessage() for r in caplog.records)


def test_backfill_skips_refused_records_and_goes_on(tmp_path, server):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for i in range(20):
            tel.scalars({"Loss/critic": float(i)})
    tel.close()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    bad = json.loads(lines[5])
    bad["seq"] = -1  # a record the service refuses, in the middle of the file
    lines[5] = json.dumps(bad)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    totals = backfill(run_dir, server.url, batch_size=8)
    assert totals["rejected"] == 1 and "seq" in totals["reasons"][0]
    assert totals["accepted"] == len(lines) - 1
    assert server.storage.run(run_dir.name)["status"] == "finished"


def test_an_outage_longer_than_the_retry_window_keeps_the_lifecycle(caplog):
    server = ScriptedIngest(down_until=time.monotonic() + 3.0)
    drops = Drops()
    seq = iter(range(10**6))
    made = lambda kind, **fields: (kind, json.dumps({"run_id": "r", "writer": "h:1", "seq": next(seq), "ts": 1.0, "kind": kind, **fields}))  # noqa: E731
    sender = HttpSender(server.url, None, heartbeat=lambda: made("heartbeat"), drops=drops, interval_s=0.05, retry_window_s=0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            sender.submit([made("run", status="pending", config={"lr": 1e-3})])
            sender.submit([made("run", status="running", config={"lr": 1e-3})])
            for i in range(5):
                sender.submit([made("scalars", step=i, axes={}, values={"x": i})])
            sender.submit([made("event", name="warmup_done", attributes={})])
            time.sleep(1.5)  # past the retry window, still down
            sender.close(Deadline(10.0))
            assert sender.join(Deadline(10.0))
    finally:
        server.stop()
    kinds = server.kinds()
    assert kinds.count("run") == 2 and "event" in kinds  # delivered after the outage
    assert drops.by_kind("http").get("scalars", 0) >= 1  # only scalars were dropped, and counted
    assert any("keeping" in r.getMessage() and "lifecycle" in r.getMessage() for r in caplog.records)


def test_a_trickling_service_cannot_hold_the_sender(caplog):
    server = TrickleServer(every_s=0.3)
    drops = Drops()
    seq = iter(range(10**6))
    made = lambda kind, **fields: (kind, json.dumps({"run_id": "r", "writer": "h:1", "seq": next(seq), "ts": 1.0, "kind": kind, **fields}))  # noqa: E731
    sender = HttpSender(
        server.url, None, heartbeat=lambda: made("heartbeat"), drops=drops, interval_s=0.05,
        request_timeout_s=0.5, retry_window_s=1.0, stall_warning_s=1.0,
    )  # fmt: skip
    try:
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            for i in range(50):
                sender.submit([made("scalars", step=i, axes={}, values={"x": i})])
            time.sleep(2.5)
            started = time.monotonic()
            sender.close(Deadline(1.0))
            assert sender.join(Deadline(3.0))
            closed_in = time.monotonic() - started
    finally:
        server.stop()
    assert server.requests >= 2  # each request gave up at its deadline and the sender tried again
    assert closed_in < 2.0
    assert drops.by_kind("http").get("scalars", 0) == 50
    messages = [r.getMessage() for r in caplog.records]
    assert sum("has accepted nothing for" in m or "cannot take records" in m for m in messages) == 1  # said once, as soon as it is seen


# -- 9-12: shutdown and signals --------------------------------------------------------------

SIGNALLED_CHILD = textwrap.dedent(
    """
    import sys, time
    import otel_rl
    tel = otel_rl.init(run_dir=sys.argv[1], motrix_url=sys.argv[2], system_metrics_interval_s=0)
    with tel.run():
        i = 0
        while True:
            with tel.iteration(i, env_steps=i):
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Loss/critic": float(i)})
            if i == 5:
                print("ready", flush=True)
            i += 1
    """
)


def test_two_sigterms_in_a_row_still_write_every_output(tmp_path, server):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNALLED_CHILD, str(run_dir), server.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"},
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.001)  # a launcher forwarding the signal again
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    assert proc.returncode == 143, proc.stderr.read()
    lines = read_jsonl(run_dir)
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "killed"]
    assert server.storage.run(run_dir.name)["status"] == "killed"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def test_an_exception_whose_message_cannot_be_read_still_ends_the_run(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with pytest.raises(Unprintable):  # the original exception, re-raised
        with tel.run():
            raise Unprintable()
    tel.close()
    (failed,) = [r for r in read_jsonl(tmp_path) if r.get("status") == "failed"]
    assert failed["reason"].startswith("Unprintable: <the message could not be read")
    assert failure_reason(Unprintable()) == failed["reason"]


def test_close_waits_for_every_output_within_one_deadline(tmp_path):
    """A hung OTLP collector may take the whole deadline; the JSONL file is complete when close() returns."""
    silent = SilentServer()
    try:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = silent.url
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
        tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0.5)
        tel.watch_worker(subprocess.Popen([sys.executable, "-c", "pass"]), "collector 0")
        with tel.run():
            for i in range(20):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        pass
                tel.scalars({"Loss/critic": float(i)})
        started = time.monotonic()
        tel.close(timeout_s=4.0)  # the agent process starts and writes: seconds on a loaded 2-core host
        took = time.monotonic() - started
        lines = read_jsonl(tmp_path)  # right after close(): no join, no sleep
    finally:
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"]
        silent.stop()
    assert took < 5.0
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert sum(1 for r in lines if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 20
    assert not [t for t in threading.enumerate() if t.name in ("otel-rl-jsonl", "otel-rl-pipeline", "otel-rl-system", "otel-rl-workers")]


def test_a_full_disk_that_frees_up_leaves_whole_records_once(small_disk, caplog):
    run_dir = small_disk / "run"
    filler = small_disk / "filler"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run(config={"note": "x" * 1000}):
            tel.scalars({"Loss/critic": 0.0})
            tel.flush()
            with open(filler, "wb", buffering=0) as fill:  # the disk fills up
                try:
                    while True:
                        fill.write(b"\0" * 4096)
                        fill.flush()
                except OSError:
                    pass
            for i in range(1, 400):
                tel.scalars({f"Loss/k{j}": float(i) for j in range(10)})
                if i % 100 == 0:
                    tel.flush(timeout_s=1)  # writes fail, partly
            filler.unlink()  # and frees up again
            tel.flush(timeout_s=5)
    tel.close()
    raw = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in raw]  # every line is a whole record
    seqs = [(r["writer"], r["seq"]) for r in records]
    assert len(seqs) == len(set(seqs))  # none written twice
    assert sum(1 for r in records if r["kind"] == "scalars" and "Loss/k0" in r["values"]) == 399
    assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert any("No space left" in r.getMessage() for r in caplog.records)


FILLS_UP = """
import json, sys, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0, shutdown_timeout_s=5)
with tel.run():
    for i in range(3000):
        with tel.iteration(i, env_steps=i):
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/value": float(i)}, step=i)
tel.close()
print(json.dumps(tel.stats()["dropped"]))
"""


def test_a_disk_that_fills_mid_run_and_stays_full_counts_what_it_lost_and_says_the_folder_is_incomplete(small_disk):
    """256 KiB: the run's own files fill it part way. What the folder cannot keep is counted, the close keeps its
    deadline, every line and packet that is there is whole, and the end line says the folder does not hold the end."""
    from otel_rl.readers.analysis import protobuf_engine

    run_dir = small_disk / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-c", FILLS_UP, str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began < 60  # the close kept its 5 s deadline (the disk refuses at once: nothing waits for it)
    dropped = json.loads(result.stdout.strip().splitlines()[-1])
    (end,) = [line for line in result.stderr.splitlines() if " finished after " in line]
    assert "but its folder could not keep everything: metrics.jsonl lost " in end and "records (No space left on device)" in end
    lost = int(end.split("metrics.jsonl lost ")[1].split(" records")[0].replace(",", ""))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # each line whole
    kept = [r for r in records if r["kind"] == "scalars" and "Loss/value" in r["values"]]
    assert lost == dropped["jsonl"] and 0 < len(kept) < 3000 and len(kept) + lost >= 3000  # every record kept or counted
    assert [r["values"]["Loss/value"] for r in kept] == [float(i) for i in range(len(kept))]  # the first ones, in order
    model = protobuf_engine.read([run_dir / "trace.perfetto-trace"])  # readable up to where the disk refused (which file
    learning = sum(1 for s in model.slices if s.name == "Learning")  # fills the disk first depends on their timing)
    assert learning + dropped.get("perfetto", 0) >= 3000  # every iteration in the trace or counted
    # The folder records how the run ended, or the end line says plainly where it could not (what a cut-back line frees
    # may take a small file, or the last record: which depends on the order the writers met the full disk).
    summary = run_dir / "run_summary.json"
    if summary.exists():
        assert json.loads(summary.read_text())["status"] == "finished"
    else:
        assert "run_summary.json was not written (No space left on device)" in end
    if [r["status"] for r in records if r["kind"] == "run"][-1] != "finished":
        assert "the run's end among them" in end
    assert not list(run_dir.glob("*.tmp")) and not list(run_dir.glob(".*.tmp"))


DELETED = """
import shutil, sys, time, otel_rl
run_dir, what = sys.argv[1], sys.argv[2]
tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0)
with tel.run():
    for i in range(400):
        if i == 200:
            tel.flush()
            shutil.rmtree(run_dir) if what == "folder" else __import__("os").remove(run_dir + "/metrics.jsonl")
        with tel.iteration(i, env_steps=i):
            pass
        tel.scalars({"Loss/value": float(i)}, step=i)
tel.close()
"""


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_metrics_file_or_run_folder_deleted_mid_run_is_said_once_and_written_anew(tmp_path, what):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run([sys.executable, "-c", DELETED, str(run_dir), what], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "was deleted or replaced while the run wrote it" in line]
    assert len(said) == 1 and str(run_dir / "metrics.jsonl") in said[0]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [r["values"]["Loss/value"] for r in records if r["kind"] == "scalars" and "Loss/value" in r["values"]]
    assert values == [float(i) for i in range(200, 400)]  # everything after the deletion, once
    assert [r["status"] for r in records if r["kind"] == "run"] == ["finished"]  # the run's end is in the new file
    assert json.loads((run_dir / "run_summary.json").read_text())["status"] == "finished"


# -- 13-15: background threads never die; every drop is counted -----------------------------


def test_background_workers_survive_a_failing_round_and_log_its_traceback(tmp_path, caplog):
    from otel_rl.core.system_metrics import SystemSampler

    calls = []

    def flaky(values):
        calls.append(values)
        if len(calls) <= 2:
            raise RuntimeError("sampling backend hiccup")

    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        sampler = SystemSampler(flaky, interval_s=0.05)
        deadline = time.monotonic() + 5
        while len(calls) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sampler.alive
        sampler.shutdown(Deadline(1))
    assert len(calls) >= 5  # kept sampling after its failures
    failures = [r for r in caplog.records if "round failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info and "hiccup" in caplog.text  # once, with its traceback


def test_a_failing_sink_does_not_stop_the_pipeline_or_the_other_sinks(tmp_path, caplog, capture):
    from otel_rl.core.pipeline import RecordSink

    class Broken(RecordSink):
        def on_scalars(self, block):
            raise ValueError("a sink bug")

    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.telemetry.Telemetry(otel_rl.TelemetryConfig(system_metrics_interval_s=0), sinks=[Broken(), capture])
        for i in range(5):
            tel.scalars({"Loss/critic": float(i)})
            tel.flush()
        tel.close()
    assert len(capture.scalars) == 5
    assert sum("Broken.on_scalars" in r.getMessage() for r in caplog.records) == 1


def test_flush_means_written_even_racing_with_submits(tmp_path):
    writer = JsonlWriter(tmp_path / "m.jsonl", Drops(), interval_s=60)  # only flushes write
    try:
        for n in range(200):
            writer.submit([("scalars", json.dumps({"n": n}))])
            assert writer.flush(Deadline(5))
            assert len((tmp_path / "m.jsonl").read_text().splitlines()) == n + 1
    finally:
        writer.shutdown(Deadline(2))


def test_a_burst_of_unique_keys_is_one_drop_report_not_thousands_of_lines(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.run():
            for chunk in range(50):
                tel.scalars({f"custom/key_{chunk}_{i}": 1.0 for i in range(1000)})
        tel.flush()
        dropped = tel.stats()["dropped"]
        tel.close()
    assert len(caplog.records) < 30
    records = read_jsonl(tmp_path)
    reports = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == "records_dropped"]
    keys = [a for a in reports if a["queue"] == "scalar_keys"]
    assert keys and sum(a["total"] for a in keys) == dropped["scalar_keys"] == 40_000


def test_every_bounded_queue_reports_its_drops_under_its_name(tmp_path):
    from otel_rl.shm.segment import CONTROL_BYTES, DATA_BYTES

    # A pass an hour: every queue of the training thread fills before the pipeline reads it. Each is sent three
    # times what it holds counting only the payload (8 bytes a value, 1,000 bytes an event), so it overflows
    # whatever the framing costs: the outcome is certain on any machine.
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, trace_enabled=True, lane_capacity=8, pipeline_interval_s=3600, system_metrics_interval_s=0, agent="thread")
    keys = [f"Loss/k{k:02d}" for k in range(32)]
    with tel.run():
        for i in range(200):  # 25 times the lane
            with tel.phase("learning"):
                pass
        for i in range(3 * DATA_BYTES // (8 * len(keys))):
            tel.scalars(dict.fromkeys(keys, float(i)))
        for i in range(10):  # the data ring is full: each distribution is refused
            tel.distribution("Train/advantage", np.arange(64, dtype=np.float64))
        for i in range(3 * CONTROL_BYTES // 1000):
            tel.event("marker", note="x" * 1000)
    tel.flush()
    dropped = tel.stats()["dropped"]
    tel.close()
    queues = ("phases", "scalars", "distributions", "events")
    assert all(dropped[queue] > 0 for queue in queues), dropped
    reports: dict[str, int] = {}
    for r in read_jsonl(tmp_path):
        if r["kind"] == "event" and r["name"] == "records_dropped":
            reports[r["attributes"]["queue"]] = reports.get(r["attributes"]["queue"], 0) + r["attributes"]["total"]
    assert {queue: reports.get(queue) for queue in queues} == {queue: dropped[queue] for queue in queues}


@pytest.mark.parametrize("agent", ["process", "thread"])
def test_a_burst_leaves_in_the_run_folder_every_record_the_source_did_not_count_as_dropped(tmp_path, agent):
    """300,000 one-key calls at once: what the source took, metrics.jsonl has; the file never drops what the pipeline took."""
    tel = otel_rl.init(run_dir=tmp_path, agent=agent, system_metrics_interval_s=0, panel=False)
    with tel.run():
        for i in range(300_000):
            tel.scalars({"Loss/critic": float(i)})
        tel.flush(timeout_s=60)
        dropped = tel.stats()["dropped"]
    tel.close(timeout_s=30)
    written = [r["values"]["Loss/critic"] for r in read_jsonl(tmp_path) if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert dropped.get("jsonl", 0) == 0 and len(written) + dropped["scalars"] == 300_000, dropped
    assert written == sorted(set(written))  # each once, in order


# -- 16-19: construction, stand-ins, CUDA timing, standard variables -------------------------


@pytest.mark.parametrize(
    "option",
    [
        {"system_metrics_interval_s": -1},
        {"system_metrics_interval_s": "2"},
        {"trace_max_bytes": 0},
        {"perf_interval_s": 0},
        {"role": ""},
        {"run_id": "r" * 300},
        {"motrix_url": "ftp://example"},
        {"metric_export_interval_ms": -5},
        {"panel": "yes"},
        {"lane_capacity": 1.5},
    ],
)
def test_a_bad_option_raises_before_anything_starts(tmp_path, option):
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises((ValueError, TypeError)) as raised:
        otel_rl.init(run_dir=tmp_path, jsonl=True, trace_enabled=True, **option)
    assert next(iter(option)) in str(raised.value)
    time.sleep(0.1)
    assert {t.ident for t in threading.enumerate()} <= before  # nothing left running (earlier tests' threads may end)
    assert not (tmp_path / "metrics.jsonl").exists()


def _public(obj) -> dict[str, object]:
    return {name: getattr(type(obj), name, None) for name in dir(obj) if not name.startswith("_")}


def test_the_disabled_telemetry_has_the_whole_public_surface(tmp_path):
    real = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    disabled = otel_rl.init(run_dir=tmp_path, enabled=False)
    assert isinstance(disabled, NoOpTelemetry)
    real_api, noop_api = _public(real), _public(disabled)
    assert set(real_api) == set(noop_api), set(real_api) ^ set(noop_api)
    for name, member in real_api.items():
        if callable(member):
            assert inspect.signature(member).parameters.keys() == inspect.signature(noop_api[name]).parameters.keys(), name
    assert set(vars(real)) - {n for n in vars(real) if n.startswith("_")} <= {"config", "trace_id"}
    with disabled.run(config={"x": 1}, family="rl.offpolicy"):
        with disabled.iteration(0), disabled.phase("learning"):
            disabled.scalars({"Loss/critic": 1.0})
    assert disabled.run_id == real.run_id
    real.close()


@pytest.mark.slow
def test_the_demo_runs_with_the_sdk_disabled_and_serving(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env["OTEL_SDK_DISABLED"] = "true"
    result = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "demo", "--iterations", "20", "--learning-starts", "64",
         "--runs-dir", str(tmp_path), "--no-panel", "--serve"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


class StandInEvent:
    """A CUDA event on the host clock: records a time, completes when its stream says so."""

    def __init__(self, api) -> None:
        self.api = api
        self.at_ns: int | None = None

    def record(self, stream) -> None:
        self.at_ns = time.perf_counter_ns() + stream.lag_ns

    def query(self) -> bool:
        return self.at_ns is not None and time.perf_counter_ns() >= self.at_ns

    def synchronize(self) -> None:
        self.api.synchronized_on.add(threading.current_thread().name)
        while not self.query():
            time.sleep(0.0005)

    def elapsed_time(self, other) -> float:
        return (other.at_ns - self.at_ns) / 1e6


class StandInStream:
    def __init__(self, device: int, lag_ns: int) -> None:
        self.device = type("Device", (), {"index": device})()
        self.stream_id = 7
        self.lag_ns = lag_ns


class StandInCuda:
    """A :class:`otel_rl.training.cuda_timing.DeviceApi` on the CPU: work 'runs' 2 ms after it is queued."""

    def __init__(self) -> None:
        self.synchronized_on: set[str] = set()
        self.stream = StandInStream(0, 2_000_000)

    def new_event(self):
        return StandInEvent(self)

    def new_stream(self, device: int):
        return StandInStream(device, 0)

    def current_stream(self):
        return self.stream


class _Intervals:
    """The GPU intervals a recorder wrote into its segment, read as the pipeline reads them."""

    def __init__(self, recorder) -> None:
        from otel_rl.core.segment_source import SegmentSource
        from otel_rl.shm import segment as shm

        self._source = SegmentSource(shm.SegmentReader(recorder.segment.buffer), commits=True)
        self.read: list[tuple] = []

    def wait_for(self, count: int, timeout_s: float = 5.0) -> list[tuple]:
        from otel_rl.core.pipeline import Batch

        deadline = time.monotonic() + timeout_s
        while len(self.read) < count and time.monotonic() < deadline:
            batch = Batch()
            self._source.take(batch)
            self.read += batch.intervals
            time.sleep(0.01)
        return self.read


def _recorder():
    from otel_rl.shm import segment as shm
    from otel_rl.training.recorder import Recorder

    return Recorder(shm.Segment(None, b"", 4096), 4096)


def test_cuda_timing_calibrates_on_its_own_thread_and_places_device_intervals():
    from otel_rl.base.clock import Clock
    from otel_rl.base.deadline import Deadline
    from otel_rl.formats.schema import phase_spec
    from otel_rl.training.cuda_timing import CudaPhase, CudaTimer

    recorder = _recorder()
    clock = Clock()
    api = StandInCuda()
    timer = CudaTimer(recorder, clock.to_epoch_ns, device_api=api, poll_interval_s=0.002)
    phase = CudaPhase(recorder.new_phase(phase_spec("learner", "learning")), timer, None, recorder)
    host_windows = []
    for _ in range(5):
        start = clock.now_ns()
        with phase:  # the very first one needs an anchor: it must not wait for it here
            time.sleep(0.001)
        host_windows.append((start, clock.now_ns()))
    assert api.synchronized_on <= {"otel-rl-cuda"}  # never the training thread
    intervals = _Intervals(recorder).wait_for(5)
    timer.shutdown(Deadline(1))
    assert api.synchronized_on == {"otel-rl-cuda"} and len(intervals) == 5
    for (_, _, _, start_ns, end_ns, _), (host_start, host_end) in zip(intervals, host_windows):
        # The stand-in device runs everything 2 ms after the host queued it.
        assert host_start + 1_500_000 <= start_ns <= host_end + 2_500_000
        assert 0 < end_ns - start_ns < 50_000_000


def test_a_failing_device_query_does_not_stop_the_resolver(caplog):
    from otel_rl.base.clock import Clock
    from otel_rl.base.deadline import Deadline
    from otel_rl.formats.schema import phase_spec
    from otel_rl.training.cuda_timing import CudaPhase, CudaTimer

    class Flaky(StandInEvent):
        failures = [1]

        def query(self) -> bool:
            if self.failures:
                self.failures.pop()
                raise RuntimeError("CUDA error: an illegal memory access")
            return super().query()

    api = StandInCuda()
    api.new_event = lambda: Flaky(api)
    recorder = _recorder()
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        timer = CudaTimer(recorder, clock.to_epoch_ns, device_api=api, poll_interval_s=0.002)
        phase = CudaPhase(recorder.new_phase(phase_spec("learner", "learning")), timer, None, recorder)
        for _ in range(3):
            with phase:
                pass
        intervals = _Intervals(recorder).wait_for(3)
        timer.shutdown(Deadline(1))
    assert len(intervals) == 3
    assert any("illegal memory access" in r.getMessage() or "illegal memory access" in (r.exc_text or "") for r in caplog.records)


# -- 21-22: crashed workers, custom keys --------------------------------------------------------


def crashing_worker(spec) -> None:
    from otel_rl.worker_processes import init_worker

    tel = init_worker(spec, system_metrics_interval_s=0)
    for tick in range(20):
        with tel.iteration(tick, timeline="collector"):
            with tel.phase("env_step", "collector"):
                time.sleep(0.002)
    tel.flush()
    time.sleep(0.7)  # the trace writer wrote what it had
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_workers_trace_is_merged_and_marked(tmp_path):
    import multiprocessing as mp

    from otel_rl.formats.trace import CRASH_MARK
    from otel_rl.readers.analysis import protobuf_engine, trace_files

    tel = otel_rl.init(run_dir=tmp_path, trace_enabled=True, system_metrics_interval_s=0)
    context = mp.get_context("spawn")
    with tel.run():
        worker = context.Process(target=crashing_worker, args=(tel.worker_spec("collector 0", context),))
        worker.start()
        worker.join(60)
        assert worker.exitcode == -signal.SIGKILL
    tel.close()
    assert not list(tmp_path.glob("trace-*"))  # nothing left unmerged
    model = protobuf_engine.read(trace_files(tmp_path))
    env_steps = [s for s in model.slices if s.process == "collector 0" and s.name == "Env Step"]
    assert len(env_steps) == 20
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    trace = Trace.FromString((tmp_path / "trace.perfetto-trace").read_bytes())
    marks = [p for p in trace.packet if p.track_event.name.startswith(CRASH_MARK)]  # the agent adds the reason
    assert len(marks) == 1 and marks[0].timestamp >= max(s.end_ns for s in env_steps)


def test_keys_that_are_nothing_but_bad_characters_still_get_a_name(capture):
    tel = otel_rl.telemetry.Telemetry(otel_rl.TelemetryConfig(system_metrics_interval_s=0), sinks=[capture])
    tel.scalars({"": 1.0, "!!!": 2.0})
    tel.close()
    assert capture.scalars[0].values == {"custom/unnamed": 1.0, "custom/___": 2.0}

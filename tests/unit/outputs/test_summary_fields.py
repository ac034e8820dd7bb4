"""The loop's own fields in run_summary.json (seed 001's backend_diagnostics), and its reward terms (seed 003's components)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import otel_rl


def test_the_loops_own_fields_reach_run_summary_json_and_otel_rls_stay_its_own(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    diagnostics = {"cuda_graph": {"requested": True, "enabled": False, "disable_reason": "dynamic shapes"}, "envs": np.int64(4096)}
    with caplog.at_level(logging.WARNING), tel.run():
        for i in range(3):
            with tel.iteration(i, env_steps=i + 1):
                pass
        tel.add_summary(backend_diagnostics=diagnostics, note="first")
        tel.add_summary(note="second", status="mine", timelines=[])  # a later call replaces; otel-rl's own names are left out
    tel.close()
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["backend_diagnostics"] == {"cuda_graph": {"requested": True, "enabled": False, "disable_reason": "dynamic shapes"}, "envs": 4096}
    assert summary["note"] == "second" and summary["status"] == "finished" and summary["timelines"]
    said = [r.getMessage() for r in caplog.records if "add_summary" in r.getMessage()]
    assert len(said) == 2 and "status" in said[0] + said[1] and "timelines" in said[0] + said[1]


def test_a_run_without_a_folder_takes_the_call_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tel = otel_rl.init(system_metrics_interval_s=0)
    with tel.run():
        assert tel.add_summary(backend_diagnostics={"a": 1}) is None
    tel.close()
    disabled = otel_rl.init(enabled=False)
    assert disabled.add_summary(backend_diagnostics={"a": 1}) is None and disabled.status("ok") is None
    assert list(tmp_path.iterdir()) == []


def test_reward_terms_go_under_reward_and_show_in_the_panels_rewards(tmp_path, caplog):
    """Seed 003's reward components: bare names under reward/, reward/ keys kept, the rest as scalars()."""
    import torch

    from otel_rl.outputs.panel import PanelState, PanelView

    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING), tel.run():
        with tel.iteration(0, env_steps=64):
            pass
        tel.reward_terms({"upright": torch.tensor(0.8), "reward/effort": -0.1, "bad": "x"})
        tel.reward_terms([("not", "a mapping")])
    tel.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (terms,) = [r for r in rows if r["kind"] == "scalars" and "reward/upright" in r["values"]]
    assert terms["values"] == {"reward/upright": pytest.approx(0.8, rel=1e-6), "reward/effort": -0.1} and terms["step"] == 64
    assert sum("reward_terms() takes a mapping" in r.getMessage() for r in caplog.records) == 1
    state = PanelState()
    from otel_rl.core.batches import ScalarBatch
    from otel_rl.core.records import ScalarsRecord

    state.add_scalars(ScalarBatch.of([ScalarsRecord(1, {"reward/upright": 0.8}, None, None, None)]))
    assert ("upright", "0.8") in PanelView(state, "run").sections(short=True)["rewards"]


def test_a_status_or_reward_term_whose_repr_raises_costs_only_itself(tmp_path):
    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no repr")

    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    with tel.run():
        with tel.iteration(0, env_steps=8):
            pass
        tel.status(Unprintable())
        tel.reward_terms({Unprintable(): 1.0, "upright": 0.5})
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (status,) = [r for r in rows if r["kind"] == "event" and r["name"] == "status"]
    assert status["attributes"]["text"].endswith("Unprintable object>")  # its type, never its own repr
    assert [r["values"] for r in rows if r["kind"] == "scalars" and not any(k.startswith("Perf/") for k in r["values"])] == [
        {"reward/upright": 0.5}, {"Loss/critic": 1.0}]  # fmt: skip
    assert rows[-1]["status"] == "finished"

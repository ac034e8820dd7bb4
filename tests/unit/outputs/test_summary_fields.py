"""The loop's own fields in run_summary.json (seed 001's backend_diagnostics), beside otel-rl's."""

from __future__ import annotations

import json
import logging

import numpy as np

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

"""Runs from before the metric schema (seed 001's --legacy-unversioned path): TensorBoard event files read in canonical keys, failing closed."""

from __future__ import annotations

import json

import pytest
from torch.utils.tensorboard import SummaryWriter

import otel_rl.read as read


def legacy_run(folder, tags: dict[str, list[float]]) -> None:
    """Event files as an earlier logger wrote them: one scalar per tag and step (TensorBoard's own writer)."""
    writer = SummaryWriter(str(folder / "tb"))
    for tag, values in tags.items():
        for step, value in enumerate(values):
            writer.add_scalar(tag, value, (step + 1) * 1000)
    writer.close()


def test_a_pre_schema_appo_run_reads_in_canonical_keys_and_units(tmp_path):
    legacy_run(tmp_path, {
        "perf/iter_ms": [12.0, 14.0], "reward/mean_ep100": [-300.0, -250.0], "timing/collector_mlp_infer_ms": [0.4, 0.5],
        "timing/collector_rollout_ms": [900.0, 950.0], "perf/collector_cycle_ms": [3.0, 3.0], "loss/custom": [1.0, 0.5],
    })  # fmt: skip
    frame = read.legacy_scalars(tmp_path)
    assert list(frame.index) == [1000, 2000] and frame.index.name == "step"
    assert frame["Perf/iteration_time"].tolist() == pytest.approx([0.012, 0.014])  # ms to seconds
    assert frame["Train/mean_reward"].tolist() == [-300.0, -250.0]
    assert frame["Perf/collector_mlp_infer_ms"].tolist() == pytest.approx([0.4, 0.5])  # APPO's collector, canonical
    assert frame["Perf/collection_time"].tolist() == pytest.approx([0.9, 0.95])
    assert "perf/collector_cycle_ms" not in frame and "loss/custom" in frame  # retired tags left out, others as they are


def test_a_run_that_is_not_pre_schema_is_refused_never_guessed(tmp_path):
    legacy_run(tmp_path / "canonical", {"Perf/iteration_time": [0.01], "perf/iter_ms": [10.0]})
    with pytest.raises(read.SourceError, match="has canonical tags"):
        read.legacy_scalars(tmp_path / "canonical")
    legacy_run(tmp_path / "stamped", {"perf/iter_ms": [10.0]})
    (tmp_path / "stamped" / "run_summary.json").write_text(json.dumps({"metric_schema_version": 1}))
    with pytest.raises(read.SourceError, match="stamped with a metric schema version"):
        read.legacy_scalars(tmp_path / "stamped")
    (tmp_path / "empty").mkdir()
    with pytest.raises(read.SourceError, match="holds no TensorBoard event files"):
        read.legacy_scalars(tmp_path / "empty")


def test_analyze_on_a_pre_schema_run_says_how_to_read_it(tmp_path):
    import subprocess
    import sys

    legacy_run(tmp_path, {"perf/iter_ms": [12.0]})
    result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1
    assert "otel_rl.read.legacy_scalars() reads a run from before the metric schema" in result.stderr

"""What every library integration must produce: checked on the real trace file and metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from otel_rl.readers.analysis import protobuf_engine, trace_files


def phases_by_process(run_dir: Path) -> dict[str, set[str]]:
    """Phase titles (and ``Iteration`` slices) per process of the run's trace."""
    model = protobuf_engine.read(trace_files(run_dir))
    out: dict[str, set[str]] = {}
    for s in model.slices:
        out.setdefault(s.process, set()).add(s.name)
    return out


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scalar_keys(run_dir: Path) -> set[str]:
    return set().union(*(r["values"] for r in records(run_dir) if r["kind"] == "scalars"))


def check_run(run_dir: Path, phases: dict[str, set[str]], keys: set[str]) -> dict:
    """The trace has ``phases`` per process, ``metrics.jsonl`` the canonical ``keys`` and a finished lifecycle."""
    seen = phases_by_process(run_dir)
    for process, wanted in phases.items():
        assert wanted <= seen.get(process, set()), (process, wanted - seen.get(process, set()), sorted(seen))
    all_records = records(run_dir)
    assert [r["status"] for r in all_records if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert len({r["run_id"] for r in all_records}) == 1
    found = scalar_keys(run_dir)
    assert keys <= found, sorted(keys - found)
    return {"processes": seen, "keys": found}


def counts(run_dir: Path) -> dict[str, dict]:
    """Per timeline, cycles and phase occurrences as the pipeline counted them (``run_summary.json``)."""
    timelines = json.loads((run_dir / "run_summary.json").read_text())["timelines"]
    return {
        timeline: {"cycles": entry["iterations"]["count"], **{name: stat["count"] for name, stat in entry["phases"].items()}}
        for timeline, entry in timelines.items()
    }


def framework(run_dir: Path) -> dict:
    """What the integration said the run trains on (its ``framework`` event: ``rl.system``, ``rl.environment.name`` and ``rl.algorithm``)."""
    (described,) = [r["attributes"] for r in records(run_dir) if r["kind"] == "event" and r["name"] == "framework"]
    return described

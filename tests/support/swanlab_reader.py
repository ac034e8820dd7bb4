"""Reading SwanLab's offline run files back with SwanLab's own reader and record format, as ``swanlab sync`` does."""

from __future__ import annotations

from pathlib import Path

import yaml


def run_dirs(folder: Path) -> list[Path]:
    """The SwanLab runs written under ``folder``, oldest first."""
    return sorted(folder.glob("run-*"))


def records(run: Path) -> list:
    """Every record of one run's file (SwanLab's ``Record`` messages), in order."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = run.glob("*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    found = []
    while (data := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(data)
        found.append(record)
    return found


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Each key's ``(step, value)`` points, in the order logged."""
    points: dict[str, list[tuple[int, float]]] = {}
    for record in records(run):
        if record.HasField("scalar"):
            points.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
    return points


def finish(run: Path) -> tuple[str, str]:
    """The run's one finish record: its state's name and its error."""
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    (found,) = [r.finish for r in records(run) if r.HasField("finish")]
    return RunState.Name(found.state), found.error


def config(run: Path) -> dict:
    """The run's configuration as SwanLab saved it (each key's value)."""
    saved = yaml.safe_load((run / "files" / "config.yaml").read_text())
    return {key: entry["value"] for key, entry in saved.items()}

"""Runs in notebooks: pandas DataFrames from a run folder, a folder of run folders, or a server.

    import otel_rl.read as read
    read.runs("runs/")                                  # a row per run
    read.scalars("runs/sac-1", keys=["Train/mean_reward"])  # every point, a column per key
    read.scalars("http://metrics:8080", run_id="sac-1")     # the same from a server (token: MOTRIX_METRICS_TOKEN)
    read.phases("runs/sac-1")                            # each iteration's phase durations, from the trace
    read.legacy_scalars("old_runs/appo-2024")            # a run from before the metric schema, in canonical keys

Needs ``pip install 'otel-rl[read]'`` (pandas, pyarrow). A source is a run
folder (it holds ``metrics.jsonl``), a folder of run folders, or a server's
base URL (``token=`` or ``MOTRIX_METRICS_TOKEN``). Values are as recorded:
nothing is thinned or smoothed; a value that was not finite is NaN.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from otel_rl.base.extras import READ, require

require(READ)

import pandas as pd  # noqa: E402

from otel_rl.readers import frames  # noqa: E402
from otel_rl.readers.frames import AXES, SourceError  # noqa: E402

__all__ = ["SourceError", "events", "legacy_scalars", "phases", "runs", "scalars"]

Source = str | os.PathLike[str]


def runs(source: Source, project: str | None = None, group: str | None = None, status: str | None = None, token: str | None = None) -> pd.DataFrame:
    """A row per run: ``run_id``, ``status``, ``project``, ``group``, ``start`` (UTC), ``duration_s``, ``env_steps``,
    ``bottleneck``, ``bottleneck_side`` and ``bottleneck_phase`` (the live verdict, or the trace's once a server has it),
    ``config.*`` (the run's configuration, flattened), and the last value of each key.

    Raises:
        SourceError: not a run folder, a folder of them, or a server that answers.
    """
    only = {"project": project, "group": group, "status": status}
    if frames.is_server(source):
        rows = [frames.server_run(entry) for entry in frames.Server(str(source), token).listing(**only)]
    else:
        rows = [{**frames.folder_run(folder), "run_id": rid} for rid, folder in frames.folders_by_run(frames.run_folders(source)).items()]
        rows = [row for row in rows if all(value is None or row.get(name) == value for name, value in only.items())]
    return pd.DataFrame(rows, columns=None if rows else ["run_id", "status", "project", "group", "start", "duration_s", "env_steps"])


def scalars(source: Source, run_id: str | None = None, keys: Sequence[str] | None = None, x: str = "env_steps", token: str | None = None) -> pd.DataFrame:
    """Every recorded point, a row per scalars record and a column per key, indexed by ``x`` (``env_steps``, ``step`` or ``ts``).

    Columns ``seq``, ``ts``, ``step``, ``env_steps`` (the other axes) come first, then the keys (all, or ``keys``:
    then only the records that carry one of them).
    From several runs (a folder of run folders or a server, without ``run_id``), one frame with a ``run_id`` column.

    Raises:
        SourceError: a bad source, an unknown ``x``, or no such run.
    """
    if x not in AXES:
        raise SourceError(f"x must be one of {', '.join(AXES)}, not {x!r}")
    if frames.is_server(source):
        server = frames.Server(str(source), token)
        ids = [run_id] if run_id is not None else [entry["run_id"] for entry in server.listing()]
        parts = {rid: server.scalars(rid, keys) for rid in ids}
    else:
        parts = {rid: frames.folder_scalars(folder) for rid, folder in _folders(source, run_id).items()}
    for rid, frame in parts.items():
        if keys is not None:  # the records that carry one of them, as a server answers
            frame = frame.reindex(columns=[c for c in ("seq", "ts", "step", "env_steps") if c in frame] + list(keys))
            parts[rid] = frame.dropna(subset=list(keys), how="all")
    return _joined(parts).set_index(x)


def legacy_scalars(folder: Source) -> pd.DataFrame:
    """A run logged before the metric schema (TensorBoard event files, no schema stamp), its tags in canonical keys.

    Seed 001's ``--legacy-unversioned`` path: indexed by ``step``, a column per canonical key (``perf/iter_ms``
    becomes ``Perf/iteration_time`` in seconds, APPO's ``timing/collector_*_ms`` ``Perf/collector_*_ms``...),
    retired tags left out. Needs the ``tensorboard`` package too.

    Raises:
        SourceError: not such a run: no event files, a schema stamp or a canonical tag (read those as they are).
    """
    from otel_rl.readers.legacy import LegacyRunError, legacy_points

    try:
        points = legacy_points(folder)
    except LegacyRunError as exc:
        raise SourceError(str(exc)) from None
    frame = pd.DataFrame.from_dict(points, orient="index")
    frame.index.name = "step"
    return frame.reindex(columns=sorted(frame.columns)).astype(float)


def events(source: Source, run_id: str | None = None, token: str | None = None) -> pd.DataFrame:
    """The run's events (``ts``, ``name``, ``attributes``), oldest first; from several runs, with a ``run_id`` column."""
    if frames.is_server(source):
        server = frames.Server(str(source), token)
        ids = [run_id] if run_id is not None else [entry["run_id"] for entry in server.listing()]
        parts = {rid: server.events(rid) for rid in ids}
    else:
        parts = {rid: frames.folder_events(folder) for rid, folder in _folders(source, run_id).items()}
    return _joined(parts)


def _joined(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One run's frame as it is; several runs' as one, led by a ``run_id`` column."""
    if len(parts) == 1:
        return next(iter(parts.values())).copy()
    tagged = [pd.concat([pd.Series(rid, index=frame.index, name="run_id"), frame], axis=1) for rid, frame in parts.items()]
    return pd.concat(tagged, ignore_index=True).copy()  # the copy joins the columns' blocks (wide frames are otherwise fragmented)


def phases(source: Source, run_id: str | None = None, token: str | None = None) -> pd.DataFrame:
    """Each iteration of each timeline and process, from the run's trace: ``timeline``, ``process``, ``iteration``
    (its index in the process), ``start`` (UTC), ``env_steps``, ``duration_ms``, then a column per top-level phase
    (its milliseconds in that iteration; NaN where the iteration had none) and ``other_ms`` (in no phase).
    From several runs (a folder of run folders or a server, without ``run_id``), one frame with a ``run_id`` column;
    a run without a trace (one still running, on a server) has no rows.

    Raises:
        SourceError: a bad source, no such run, or (for one run) no trace of it.
    """
    import tempfile

    from otel_rl.readers.analysis import read_trace

    def frame_of(path: Path, rid: str) -> pd.DataFrame | None:
        try:
            model, _ = read_trace(path, engine="python")
        except FileNotFoundError as exc:  # no trace (yet): no rows, unless it was the one run asked for
            if one:
                raise SourceError(f"run {rid!r}: {exc}") from None
            return None
        except (OSError, ValueError) as exc:  # one that cannot be read: the others are read, and it is named
            if one:
                raise SourceError(f"run {rid!r}: {exc}") from None
            unreadable.append(f"{rid} ({exc})")
            return None
        return _phase_frame(model)

    unreadable: list[str] = []

    parts: dict[str, pd.DataFrame | None] = {}
    if frames.is_server(source):
        server = frames.Server(str(source), token)
        ids = [run_id] if run_id is not None else [entry["run_id"] for entry in server.listing()]
        one = len(ids) == 1
        with tempfile.TemporaryDirectory(prefix="otel-rl-read-") as folder:
            for rid in ids:
                trace = server.trace(rid, Path(folder) / "trace.perfetto-trace", required=one)
                parts[rid] = None if trace is None else frame_of(trace, rid)
    else:
        folders = _folders(source, run_id)
        one = len(folders) == 1
        parts = {rid: frame_of(folder, rid) for rid, folder in folders.items()}
    if unreadable:
        frames.warn(f"the trace of {len(unreadable)} run(s) cannot be read and is left out: {'; '.join(unreadable[:3])}")
    found = {rid: frame for rid, frame in parts.items() if frame is not None and len(frame)}
    if not found:
        return pd.DataFrame(columns=["timeline", "process", "iteration", "start", "env_steps", "duration_ms", "other_ms"])
    return _joined(found)


def _phase_frame(model) -> pd.DataFrame:
    """A trace model's iterations as :func:`phases` returns them."""
    from otel_rl.readers.analysis.measure import phase_name

    rows, counters = {}, {}
    for index, s in enumerate(model.slices):
        if s.name == f"{s.category} iteration":
            number = counters.setdefault((s.category, s.process), 0)
            counters[(s.category, s.process)] += 1
            rows[index] = {"timeline": s.category, "process": s.process, "iteration": number,
                           "start": pd.Timestamp(s.start_ns, unit="ns", tz="UTC"), "env_steps": s.env_steps,
                           "duration_ms": s.duration_ns / 1e6, "other_ms": s.duration_ns / 1e6}  # fmt: skip
    for s in model.slices:
        row = rows.get(s.parent)
        if row is not None and s.category == row["timeline"]:
            name = phase_name(s.category, s.name) + "_ms"
            row[name] = row.get(name, 0.0) + s.duration_ns / 1e6
            row["other_ms"] -= s.duration_ns / 1e6
    frame = pd.DataFrame(list(rows.values()))
    if not len(frame):
        return frame
    first = ["timeline", "process", "iteration", "start", "env_steps", "duration_ms"]
    return frame[first + sorted(set(frame.columns) - set(first) - {"other_ms"}) + ["other_ms"]].sort_values(["timeline", "process", "iteration"], ignore_index=True)


def _folders(source: Source, run_id: str | None) -> dict[str, Path]:
    """The run folders of ``source`` by run id (the folder's name where its records name none), or the one of ``run_id``."""
    found = frames.folders_by_run(frames.run_folders(source))
    if run_id is None:
        return found
    if run_id not in found:
        raise SourceError(f"no run {run_id!r} in {source}")
    return {run_id: found[run_id]}

"""Reading a trace with SQL through Perfetto's trace processor.

Needs a ``trace_processor_shell`` binary (``bin_path``, ``--trace-processor`` or
``OTEL_RL_TRACE_PROCESSOR``): without one the ``perfetto`` package downloads
its own at first use, which fails on machines without internet access, so
otel-rl never lets it try and says so instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from otel_rl.readers.analysis.trace_model import Slice, TraceModel

_SLICES = """
SELECT s.ts AS ts, s.dur AS dur, s.name AS name, coalesce(s.category, '?') AS category,
       s.track_id AS track_id, thread.tid AS tid,
       coalesce(p_thread.pid, p_track.pid) AS pid,
       coalesce(p_thread.name, p_track.name, '') AS process_name,
       coalesce(tr.name, '') AS track_name,
       extract_arg(s.arg_set_id, 'debug.env_steps') AS env_steps
FROM slice s
JOIN track tr ON tr.id = s.track_id
LEFT JOIN thread_track tt ON tt.id = s.track_id
LEFT JOIN thread USING (utid)
LEFT JOIN process p_thread ON p_thread.upid = thread.upid
LEFT JOIN process_track pt ON pt.id = s.track_id
LEFT JOIN process p_track ON p_track.upid = pt.upid
WHERE s.dur >= 0
"""

_COUNTERS = """
SELECT t.name AS name, c.ts AS ts, c.value AS value, p.name AS process_name
FROM counter c JOIN counter_track t ON t.id = c.track_id
LEFT JOIN process_counter_track pt ON pt.id = c.track_id LEFT JOIN process p ON p.upid = pt.upid
ORDER BY c.ts
"""


class TraceProcessorUnavailable(RuntimeError):
    """No ``trace_processor_shell`` binary is configured."""


def read(files: list[Path], bin_path: str | None) -> TraceModel:
    if not bin_path:
        raise TraceProcessorUnavailable(
            "the SQL engine needs a trace_processor_shell binary: pass --trace-processor PATH or set "
            "OTEL_RL_TRACE_PROCESSOR (the perfetto package would otherwise download one, which needs internet "
            "access); the python engine needs nothing"
        )
    if not os.access(bin_path, os.X_OK):
        raise TraceProcessorUnavailable(f"{bin_path} is not an executable trace_processor_shell")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    with tempfile.TemporaryDirectory() as tmp:
        trace = files[0]
        if len(files) > 1:  # serialized traces concatenate into one trace
            trace = Path(tmp) / "merged.perfetto-trace"
            with open(trace, "wb") as merged:
                for path in files:
                    with open(path, "rb") as part:
                        shutil.copyfileobj(part, merged)
        tp = TraceProcessor(trace=str(trace), config=TraceProcessorConfig(bin_path=bin_path))
        try:
            model = TraceModel()
            for row in tp.query(_SLICES):
                if row.tid is not None:
                    key = f"{row.pid}/{row.tid}"
                else:
                    key = f"{row.process_name}/{row.track_name}"
                steps = None if row.env_steps is None else int(row.env_steps)
                model.slices.append(Slice(row.category, row.name, row.ts, row.ts + row.dur, key, row.process_name, env_steps=steps))
            for row in tp.query(_COUNTERS):
                model.add_counter(row.process_name, row.name, row.ts, row.value)
        finally:
            tp.close()
    model.align_clocks()
    model.link_parents()
    return model

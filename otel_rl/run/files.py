"""Every name in a run folder: the outputs that write a file and the readers that read it take its name from here.

A run folder (``runs/<timestamp>/``) holds ``metrics.jsonl``, the Perfetto
trace, ``run_summary.json`` and ``run_config.json``, and, where switched on,
``tensorboard/``, ``wandb/`` and ``profile/``. The trace comes in parts: a
resumed run starts ``trace.resume-<n>.perfetto-trace``, an agent that took over
from one that died writes ``trace.agent-<k>.perfetto-trace``, a worker process
(or a rank other than 0) writes a fragment ``trace-<role>.perfetto-trace``
(``.partial`` while it is written) that the learner's trace takes in at its
end, and a file past its size limit rotates to ``trace.1.perfetto-trace``.
In a job of several machines each machine writes its own part,
``trace.node-<k>.perfetto-trace``, taking in its own ranks' and workers'
fragments (``trace-node<k>-<role>.perfetto-trace``) only.
"""

from __future__ import annotations

import re
from pathlib import Path

JSONL_FILE = "metrics.jsonl"
TRACE_FILE = "trace.perfetto-trace"
SUMMARY_FILE = "run_summary.json"
CONFIG_FILE = "run_config.json"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
PROFILE_DIR = "profile"
TRACE_UPLOAD_FILE = "trace_upload.json"
"""What became of a run sent to a service after it ended (:mod:`otel_rl.agent.send_run`, ``otel-rl backfill``): the records
it sent again (a whole backfill, when the live stream could not deliver them), the trace and the diagnosis."""
ERRORS_DIR = "errors"
"""Where a launcher keeps a failed run's error logs (the ``failed`` record lists them)."""

TRACE_SUFFIX = ".perfetto-trace"
TRACE_GLOB = "*" + TRACE_SUFFIX
"""Every trace file of a folder: the parts :func:`otel_rl.readers.analysis.read_trace` reads as one trace."""
FRAGMENT_GLOB = "trace-*" + TRACE_SUFFIX
PARTIAL_SUFFIX = ".partial"
"""A fragment's name while its process writes it (renamed when complete)."""


def trace_part(directory: Path, resumes: int, node: int | None = None) -> Path:
    """The trace file of the ``resumes``-th resumption (0: the first part's), of machine ``node`` in a job of several."""
    stem = TRACE_FILE.removesuffix(TRACE_SUFFIX)
    if node is not None:
        stem += f".node-{node}"
    if resumes:
        stem += f".resume-{resumes}"
    return directory / (stem + TRACE_SUFFIX)


def agent_part(path: Path, takeover: int) -> Path:
    """The trace part the ``takeover``-th replacement agent writes beside ``path`` (0: ``path`` itself)."""
    return path.with_name(path.name.replace(".", f".agent-{takeover}.", 1)) if takeover else path


def fragment_name(role: str, rank: int = 0, node: int | None = None) -> str:
    """The trace fragment of a worker (or of a rank other than 0) that its machine's part takes in."""
    name = role if rank == 0 else f"{role}-rank{rank}"
    return fragment_prefix(node) + re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") + TRACE_SUFFIX


def fragment_prefix(node: int | None = None) -> str:
    """How the fragments of machine ``node`` (None: of a job on one machine) begin: ``fragment_prefix(node) + "*"``
    globs the fragments its part takes in."""
    return "trace-" if node is None else f"trace-node{node}-"


def partial(path: Path) -> Path:
    """The name a fragment is written under until it is complete."""
    return path.with_name(path.name + PARTIAL_SUFFIX)


def rotated(path: Path) -> Path:
    """Where a trace file past its size limit is moved (``trace.1.perfetto-trace``)."""
    return path.with_name(path.stem + ".1" + path.suffix)

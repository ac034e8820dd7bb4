"""Continuing a run after a restart: ``init(run_dir=..., resume=True)`` (or ``OTEL_RL_RESUME=1``).

What a resumed run finds in its folder, read once by :func:`previous_run` at
``init()``: the trace id and resume count from ``run_config.json`` (so every
span joins the first part's trace), and from the tail of ``metrics.jsonl`` the
last lifecycle status and the last step of each scalar key (so a step that
goes back is reported, see :class:`otel_rl.core.step_check.StepCheck`). The outputs then continue:
``metrics.jsonl`` and TensorBoard append, the W&B run is resumed, the trace
starts a new file part (:func:`otel_rl.run.files.trace_part`) that ``otel-rl analyze`` reads
with the earlier ones, and the run records a ``resumed`` event.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.base.log import logger
from otel_rl.run.files import CONFIG_FILE, JSONL_FILE

_logger = logger(__name__)

TAIL_BYTES = 4 * 1024 * 1024
"""How much of the end of ``metrics.jsonl`` is read for the last steps and status."""


@dataclass
class PreviousRun:
    """What the run folder says about the run being resumed."""

    trace_id: int | None
    resumes: int
    """How many times the run was resumed before this one."""
    status: str
    """Its last lifecycle status; ``lost`` when it ended without a terminal record (SIGKILL, OOM kill)."""
    last_steps: dict[str, int] = field(default_factory=dict)

    @property
    def last_step(self) -> int | None:
        return max(self.last_steps.values(), default=None)


def folder_run_id(run_dir: Path) -> str | None:
    """The id of the run ``run_dir`` holds (its ``run_config.json``, else its first record), None when it holds none."""
    try:
        found = json.loads((run_dir / CONFIG_FILE).read_text()).get("run_id")
        if isinstance(found, str) and found:
            return found
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(run_dir / JSONL_FILE, "rb") as lines:
            found = json.loads(lines.readline()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


def previous_run(run_dir: Path, run_id: str) -> PreviousRun | None:
    """The run to resume in ``run_dir``, or None (one warning) when it holds nothing to resume.

    Raises:
        ValueError: ``run_dir`` holds a different run than ``run_id``.
    """
    config_path, jsonl_path = run_dir / CONFIG_FILE, run_dir / JSONL_FILE
    document: dict[str, Any] = {}
    try:
        document = json.loads(config_path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        _logger.warning("otel-rl: cannot read %s (%s); the resumed run gets a new trace id", config_path, exc)
    if document.get("run_id") not in (None, run_id):
        raise ValueError(f"resume: {run_dir} holds run {document['run_id']!r}, not {run_id!r}")
    status, last_steps = _jsonl_tail(jsonl_path)
    if not document and status is None:
        _logger.warning("otel-rl: resume: nothing to resume in %s; run %r starts afresh", run_dir, run_id)
        return None
    trace_id = None
    try:
        trace_id = int(document["trace_id"], 16) or None
    except (KeyError, TypeError, ValueError):
        if document:
            _logger.warning("otel-rl: resume: %s has no trace id; the resumed run gets a new one", config_path)
    if status in (None, lifecycle.PENDING, lifecycle.RUNNING):
        status = lifecycle.LOST
    return PreviousRun(trace_id, int(document.get("resumes") or 0), status, last_steps)


def _jsonl_tail(path: Path) -> tuple[str | None, dict[str, int]]:
    """The last run status and each key's last step in the end of ``metrics.jsonl``."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(size - TAIL_BYTES, 0))
            tail = file.read()
    except FileNotFoundError:
        return None, {}
    except OSError as exc:
        _logger.warning("otel-rl: resume: cannot read %s (%s)", path, exc)
        return None, {}
    status: str | None = None
    last_steps: dict[str, int] = {}
    for line in tail.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the cut first line, or a torn last one
        if not isinstance(record, dict):
            continue
        if record.get("kind") == "run":
            status = record.get("status")
        elif record.get("kind") == "scalars" and isinstance(record.get("step"), int):
            last_steps.update(dict.fromkeys(record.get("values") or (), record["step"]))
    return status, last_steps

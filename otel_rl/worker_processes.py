"""Worker processes (collectors) that join the learner's run.

The learner hands each worker a :class:`WorkerSpec` (picklable: pass it to
``multiprocessing.Process``, spawn or fork). In the worker,
:func:`init_worker` starts its own telemetry:

* it joins the learner's trace: the run span's W3C ``traceparent`` travels in
  the spec, so the worker's spans are children of the run span in OTLP;
* it writes its own Perfetto fragment (``trace-<role>.perfetto-trace``) with
  the same epoch timebase; the learner appends finished fragments to its
  ``trace.perfetto-trace`` at close, so the worker is its own process there;
* it relays a summary of each cycle (phase durations) over a queue, so the
  learner's panel and live metrics show the collector timeline; the learner
  owns the panel, the JSONL file and the live exporter.
"""

from __future__ import annotations

import os
from typing import Any

from otel_rl.base.environment_variables import TRACEPARENT
from otel_rl.base.log import logger
from otel_rl.training.workers import WorkerSpec

__all__ = ["WorkerSpec", "init_worker"]

_logger = logger(__name__)


def init_worker(spec: WorkerSpec, **options: Any):
    """Telemetry of a worker process; call it first thing in the worker.

    Options override the spec's (same names as :func:`otel_rl.init`).
    """
    import otel_rl

    if spec.traceparent:
        os.environ[TRACEPARENT] = spec.traceparent
    settings: dict[str, Any] = {
        "service_name": spec.service_name,
        "run_id": spec.run_id or None,
        "role": spec.role,
        "trace_enabled": spec.trace_enabled,
        "trace_output_dir": spec.run_dir,
        "jsonl": False,
        "motrix_url": None,
        "panel": False,
        "tensorboard": False,
        "wandb": False,
        "trackio": False,
        "swanlab": False,
        **spec.options,
        **options,
    }
    if spec.relay is None:
        # The learner's agent serves this worker too: it sees the worker's records and relays its cycles.
        if spec.agent is not None and "agent" not in spec.options and "agent" not in options:
            settings["agent"] = spec.agent
        tel = otel_rl.init(**settings)
        if tel.enabled and tel.stats().get("agent") != "process":
            _logger.warning("otel-rl: worker %s runs without the learner's agent; the learner will not see its cycles", spec.role)
        return tel
    # The relay sink runs where the outputs are: on a thread of this worker.
    return otel_rl.init(**settings, agent="thread", relay=spec.relay)

"""When a run streaming to a service ends, its trace and diagnosis follow: :mod:`otel_rl.agent.send_run`, detached.

The run's outputs are closed (the trace is complete, its workers' fragments
taken in) before this starts, and nothing waits for it: a process of its
own, in its own session and at a lower priority, reads the trace, analyses
it and sends both (:mod:`otel_rl.readers.run_upload`). Only the job's
speaker sends (rank 0's learner, with a run folder). When the live stream
could not deliver everything by its deadline, the same command sends the
whole of ``metrics.jsonl`` first, trying the service for a while; what became of
it is kept in the run folder (``trace_upload.json``).
"""

from __future__ import annotations

import os
import subprocess
import sys

from otel_rl.base.environment_variables import MOTRIX_METRICS_TOKEN
from otel_rl.base.log import logger
from otel_rl.config import TelemetryConfig
from otel_rl.outputs.factory import speaks_for_job
from otel_rl.run import files

_logger = logger(__name__)


UPLOAD_MODULE = "otel_rl.agent.send_run"
"""The upload's entry point (what ``otel-rl backfill`` runs too), started as a process of its own."""
RESEND_WINDOW_S = 300.0
"""How long the background job (the records the live stream could not deliver, then the trace) keeps trying the service:
every few seconds in its first minute, then every 30 s."""


def send_trace_later(config: TelemetryConfig, undelivered: int = 0) -> None:
    """Start the upload of a finished run's trace and diagnosis, where this producer speaks for a run streaming to a service.

    ``undelivered``: records the live stream had not delivered by its close deadline (the service was down). Then the
    background command is a whole backfill (``metrics.jsonl``, which holds them, then the trace), trying the service for
    :data:`RESEND_WINDOW_S`: a service back within that loses nothing (it keeps each record once).
    """
    if not (config.motrix_url and config.run_dir is not None and speaks_for_job(config)):
        return
    resend = undelivered > 0 and bool(config.jsonl) and (config.run_dir / files.JSONL_FILE).exists()
    if not resend and not (config.trace_enabled and any(config.run_dir.glob(files.TRACE_GLOB))):
        return
    env = {**os.environ, MOTRIX_METRICS_TOKEN: config.motrix_token or ""}
    what = ["--retry-window", str(RESEND_WINDOW_S)] + ([] if resend else ["--trace-only"])
    try:
        subprocess.Popen(
            [sys.executable, "-m", UPLOAD_MODULE, str(config.run_dir), "--url", config.motrix_url, *what],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:  # no process to spare: the folder keeps the trace for a later backfill
        _logger.warning("otel-rl: the run's trace is not sent to %s (%s); `otel-rl backfill %s --url %s` sends it",
                        config.motrix_url, exc, config.run_dir, config.motrix_url)  # fmt: skip

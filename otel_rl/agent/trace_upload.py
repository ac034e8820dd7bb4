"""When a run streaming to a service ends, its trace and diagnosis follow: ``otel-rl backfill --trace-only``, detached.

The run's outputs are closed (the trace is complete, its workers' fragments
taken in) before this starts, and nothing waits for it: a process of its
own, in its own session and at a lower priority, reads the trace, analyses
it and sends both (:mod:`otel_rl.readers.run_upload`). Only the job's
speaker sends (rank 0's learner, with a run folder); a service that cannot
take them leaves them to a later ``otel-rl backfill``.
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


def send_trace_later(config: TelemetryConfig) -> None:
    """Start the upload of a finished run's trace and diagnosis, where this producer speaks for a run streaming to a service."""
    if not (config.motrix_url and config.run_dir is not None and config.trace_enabled and speaks_for_job(config)):
        return
    if not any(config.run_dir.glob(files.TRACE_GLOB)):
        return
    env = {**os.environ, MOTRIX_METRICS_TOKEN: config.motrix_token or ""}
    try:
        subprocess.Popen(
            [sys.executable, "-m", "otel_rl.cli", "backfill", str(config.run_dir), "--url", config.motrix_url, "--trace-only"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:  # no process to spare: the folder keeps the trace for a later backfill
        _logger.warning("otel-rl: the run's trace is not sent to %s (%s); `otel-rl backfill %s --url %s` sends it",
                        config.motrix_url, exc, config.run_dir, config.motrix_url)  # fmt: skip

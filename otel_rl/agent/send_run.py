"""A finished run sent to a service: its records (``metrics.jsonl``), then its trace and diagnosis; the outcome said and kept.

What ``otel-rl backfill`` runs, and the entry point of the upload a run's agent
starts detached when the run ends (``python -m otel_rl.agent.send_run RUN_DIR
--url URL [--trace-only] [--retry-window S]``, the token in
``MOTRIX_METRICS_TOKEN``): the agent starts a command of its own layer (over the
outputs' backfill and the readers' analysis), not the command line's. The outcome goes to standard output and error, and to the run
folder's ``trace_upload.json``, where the user of a run whose agent sent it
(detached, its output discarded) finds it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from otel_rl.base import environment_variables as env
from otel_rl.base.files import write_atomically
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.readers.run_upload import UploadError, upload
from otel_rl.run.files import TRACE_UPLOAD_FILE

DEFAULT_RETRY_WINDOW_S = 60.0


def send_run(run_dir: Path, url: str, token: str | None, retry_window_s: float = DEFAULT_RETRY_WINDOW_S, trace_only: bool = False) -> int:
    """Send ``run_dir``'s records (unless ``trace_only``), then its trace and diagnosis; the exit status (0: all sent)."""
    folder = run_dir if run_dir.is_dir() else run_dir.parent
    if trace_only:
        try:
            os.nice(10)  # after a run, beside whatever runs next: the analysis yields the CPU
        except OSError:
            pass
        return _send_trace(folder, url, token, retry_window_s)
    try:
        totals = backfill(run_dir, url, token, retry_window_s=retry_window_s)
    except (RuntimeError, OSError, ValueError) as exc:  # refused, unreachable, not a run folder
        print(f"otel-rl backfill: {exc}", file=sys.stderr)
        if folder.is_dir():
            _note_upload(folder, {"url": url, "sent": False, "records": None, "error": str(exc)})
        return 1
    print(
        f"sent {totals['sent']} records: {totals['accepted']} new, {totals['duplicates']} already there, "
        f"{totals['rejected']} refused by the service"
    )
    for reason in totals["reasons"]:
        print(f"  refused: {reason}")
    records = {key: totals[key] for key in ("sent", "accepted", "duplicates", "rejected")}
    return _send_trace(folder, url, token, retry_window_s, records)


def _send_trace(folder: Path, url: str, token: str | None, retry_window_s: float, records: dict | None = None) -> int:
    verdict: dict = {}  # the trace's, once the service has it: the folder's readers then say what the service says

    def diagnosis_in(bottleneck: str, until: float, of_trace: dict) -> None:  # said at once: the trace may be tried for the whole window
        verdict.update(of_trace)
        _note_upload(folder, {"url": url, "sent": False, "diagnosis_sent": True, "records": records, "bottleneck": bottleneck, "verdict": verdict,
                              "trace": f"being sent, tried until {time.strftime('%H:%M:%S', time.localtime(until))}"}, interim=True)  # fmt: skip

    try:
        sent = upload(folder, url, token, retry_window_s=retry_window_s, diagnosis_sent=diagnosis_in)
    except (UploadError, ValueError, OSError) as exc:  # refused, unreachable, a trace that cannot be read
        diagnosis_sent = getattr(exc, "diagnosis_sent", False)
        what = "the trace is not sent (its diagnosis is)" if diagnosis_sent else "the trace and its diagnosis are not sent"
        print(f"otel-rl backfill: {what}: {exc}", file=sys.stderr)
        _note_upload(folder, {"url": url, "sent": False, "diagnosis_sent": diagnosis_sent, "records": records, "error": str(exc),
                              **({"verdict": verdict} if diagnosis_sent and verdict else {})})  # fmt: skip
        return 1
    if sent is not None:
        print(f"sent the trace ({sent[0] / 1e6:,.1f} MB) and its diagnosis (bottleneck: {sent[1]})")
        _note_upload(folder, {"url": url, "sent": True, "diagnosis_sent": True, "records": records, "trace_bytes": sent[0], "bottleneck": sent[1],
                              "verdict": verdict})  # fmt: skip
    elif records is not None:
        _note_upload(folder, {"url": url, "sent": True, "records": records})
    return 0


def _note_upload(folder: Path, outcome: dict, interim: bool = False) -> None:
    path = folder / TRACE_UPLOAD_FILE
    try:  # at once: the run's user (or a script) may be reading it; never a part of it
        write_atomically(path, json.dumps({**outcome, "ts": time.time()}, indent=2) + "\n")
    except OSError as exc:  # a full disk, a folder that cannot be written: said, with the outcome above it and in the exit status
        if interim:  # the outcome's own note says it
            return
        print(f"otel-rl backfill: could not write {path} ({exc.strerror or exc}); the outcome is only in this output", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_rl.agent.send_run", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--url", required=True)
    parser.add_argument("--retry-window", type=float, default=DEFAULT_RETRY_WINDOW_S)
    parser.add_argument("--trace-only", action="store_true")
    args = parser.parse_args(argv)
    return send_run(Path(args.run_dir), args.url, os.environ.get(env.MOTRIX_METRICS_TOKEN) or None, args.retry_window, args.trace_only)


if __name__ == "__main__":
    sys.exit(main())

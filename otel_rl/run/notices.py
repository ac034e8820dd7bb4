"""The two lines a run prints on standard error: where its files go when it starts, how to read them when it ends.

Printed by the process that owns the run folder, unless ``quiet``
(``OTEL_RL_QUIET=true``); a run without a folder prints nothing.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_rl.base import terminal
from otel_rl.base.log import logger
from otel_rl.config import TelemetryConfig
from otel_rl.run.files import CONFIG_FILE, JSONL_FILE, PROFILE_DIR, SUMMARY_FILE, TENSORBOARD_DIR, WANDB_DIR, trace_part

_PREFIX = "otel-rl: "
_logger = logger(__name__)


def _say(text: str) -> None:
    terminal.say(_PREFIX + text)  # a terminal that stops reading never holds the run (see otel_rl.base.terminal)


def trace_path(config: TelemetryConfig) -> Path | None:
    """Where the run's Perfetto trace (this machine's part, in a job of several) is written, None when it is off."""
    if not config.trace_enabled:
        return None
    return trace_part(Path(config.trace_output_dir or config.run_dir or "."), 0, config.machine)


def started(config: TelemetryConfig, moved_from: tuple[Path, str] | None = None) -> None:
    """The run's folder and the files it will hold; ``moved_from``: the folder (and run id) it was given, which holds another run."""
    if moved_from is not None:  # a warning when quiet: the run is not where its script asked
        earlier, earlier_id = moved_from
        text = f"{earlier} holds run {earlier_id} already; this run is {config.run_id}, in {config.run_dir} (resume=True continues {earlier_id})"
        _logger.warning(_PREFIX + text) if config.quiet else _say(text)
    if config.quiet or config.run_dir is None:
        return
    files = [SUMMARY_FILE, CONFIG_FILE]
    if config.jsonl:
        files.insert(0, JSONL_FILE)
    trace = trace_path(config)
    if trace is not None and trace.parent == config.run_dir:
        files.insert(1, trace.name)
    if config.tensorboard:
        files.append(f"{TENSORBOARD_DIR}/" if config.tensorboard_dir is None else f"TensorBoard in {config.tensorboard_dir}")
    if config.wandb:
        fields = config.wandb_fields()
        files.append(f"{WANDB_DIR}/: W&B project {fields['project']!r}, run {fields['name']!r}, {config.wandb_mode}")
    if config.swanlab:
        files.append("swanlab/")
    if config.trackio:
        files.append(f"Trackio project {config.wandb_fields()['project']!r} ({config.trackio_mode})")
    if config.profile is not None:
        start, count = config.profile
        files.append(f"{PROFILE_DIR}/: torch.profiler over learner iterations {start} to {start + count - 1}")
    _say(f"run {config.run_id} records into {config.run_dir} ({', '.join(files)})")


def ended(
    config: TelemetryConfig, status: str | None, seconds: float, failed_outputs: Sequence[str] = (), unwritten: Sequence[str] = (),
    env_steps: int | None = None, uploaded: dict[str, Any] | None = None, trackers_behind: Sequence[tuple[str, int, int, float]] = (),
) -> None:
    """How the run ended (after how many env steps, where the loop gave them), and the commands that read what it
    wrote (only files that are there); ``unwritten``: what the run folder could not keep (a full disk), said
    plainly: its files may not record the end; ``trackers_behind``: the trackers that had records yet to get
    (title, how many, how many never go, how long an agent goes on after the deadline), and where those records are."""
    if config.quiet or config.run_dir is None:
        return
    folder = shlex.quote(str(config.run_dir))
    if status is None:
        head = f"run {config.run_id} ended without a run being opened (tel.run(), tel.start_run() or an integration opens one)"
    else:
        head = f"run {config.run_id} {status} after {seconds:.1f} s" + ("" if env_steps is None else f" and {env_steps:,} env steps")
    if failed_outputs:
        head += f" without {', '.join(failed_outputs)} (could not start; see the warning above)"
    if unwritten:
        head += f", but its folder could not keep everything: {'; '.join(unwritten)}"
    if trackers_behind:
        kept = f"{JSONL_FILE} holds every one" if config.jsonl else "only the run's other outputs hold them"
        lost = [f"{title} ({lost:,} records)" for title, _, lost, _ in trackers_behind if lost]
        going = [(f"{title} ({behind:,} records)", after_s) for title, behind, lost, after_s in trackers_behind if not lost]
        if lost:
            head += f"; {_and(lost)} did not get all they took by the close deadline ({kept}; a longer shutdown_timeout_s gives them the time)"
        if going:
            head += (f"; {_and([name for name, _ in going])} still had records to get at the close deadline: the agent process "
                     f"goes on handing them over for up to {max(s for _, s in going):.0f} s ({kept})")
    trace = trace_path(config)
    if trace is not None and trace.exists() and config.machine is not None:
        hint = f"`otel-rl analyze {folder}` says where the time went, and which rank held the others up; `--merged-trace FILE` writes every machine's part as one trace for https://ui.perfetto.dev"
    elif trace is not None and trace.exists():
        hint = f"`otel-rl analyze {folder}` says where the time went; open {shlex.quote(str(trace))} in https://ui.perfetto.dev"
    else:
        hint = f"no trace was written; the records are in {folder}"
    if config.motrix_url and trace is not None and trace.exists():  # the agent started its upload, in a process of its own
        url = shlex.quote(config.motrix_url)
        resend = f"`otel-rl backfill {folder} --url {url} --trace-only`"
        if uploaded is not None and uploaded.get("sent"):  # close() waited for it (upload_wait_s)
            hint += f"; its trace and diagnosis reached {url}"
        elif uploaded is not None:
            hint += f"; its trace did not reach {url} ({uploaded.get('error', 'not sent')}): {resend} sends it"
        else:
            waited = f" after {config.upload_wait_s:g} s" if config.upload_wait_s else ""
            hint += f"; its trace and diagnosis are still on their way to {url}{waited} (should the job's end stop that process: {resend})"
    _say(f"{head}: {hint}")


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

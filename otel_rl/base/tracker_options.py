"""The experiment trackers' own options: W&B's fields, and the modes of W&B, SwanLab and Trackio.

Each tracker is configured as its users configure it: by an
:func:`otel_rl.init` keyword or by the tracker's own environment variable (the
keyword wins). A value the tracker would refuse raises here, at ``init()``,
naming the option; a wrong environment variable is warned about once and left
out. A background output never prompts for a login: a mode left unset is the
tracker's offline or local one unless its API key is set.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from otel_rl.base import environment_variables as env
from otel_rl.base.log import logger, once
from otel_rl.base.values import clean_text

_logger = logger(__name__)

WANDB_TEXT = ("wandb_project", "wandb_entity", "wandb_group", "wandb_name", "wandb_notes", "wandb_job_type")
WANDB_MODES = ("online", "offline", "disabled", "shared")
SWANLAB_MODES = ("online", "offline", "local", "disabled")
"""SwanLab's modes: ``online`` (its cloud; ``cloud`` is taken as its old name), ``offline`` (a run file that
``swanlab sync`` uploads later), ``local`` (its own dashboard), ``disabled`` (the output is left out)."""
TRACKIO_MODES = ("local", "online", "disabled")
"""Trackio's modes: ``local`` (its database under ``TRACKIO_DIR``, shown by ``trackio show``), ``online`` (the
Hugging Face Space of ``TRACKIO_SPACE_ID`` or the server of ``TRACKIO_SERVER_URL``), ``disabled``."""
_ALIASES = {"cloud": "online"}
_WANDB_VARIABLES = {
    "wandb_project": env.WANDB_PROJECT, "wandb_entity": env.WANDB_ENTITY, "wandb_group": env.WANDB_RUN_GROUP,
    "wandb_name": env.WANDB_NAME, "wandb_notes": env.WANDB_NOTES, "wandb_job_type": env.WANDB_JOB_TYPE,
}  # fmt: skip


def defaults() -> dict[str, Any]:
    """The trackers' options from their own environment variables (the keywords of :func:`otel_rl.init` win)."""
    found: dict[str, Any] = {name: os.environ.get(variable, "").strip() or None for name, variable in _WANDB_VARIABLES.items()}
    tags = [t.strip() for t in os.environ.get(env.WANDB_TAGS, "").split(",") if t.strip()]
    kept = [t for t in tags if len(t) <= 64 and clean_text(t) == t]
    if len(kept) < len(tags):  # W&B takes tags of 1 to 64 characters: the others are left out, said once
        bad = next(t for t in tags if t not in kept)
        _logger.warning("otel-rl: %s: leaving out the tag %r (W&B takes tags of 1 to 64 characters); the other tags are kept",
                        env.WANDB_TAGS, bad[:80], extra=once(f"variable:{env.WANDB_TAGS}"))  # fmt: skip
    found["wandb_tags"] = tuple(kept)
    found["wandb_mode"] = _mode_variable(env.WANDB_MODE, WANDB_MODES)
    found["swanlab_mode"] = _mode_variable(env.SWANLAB_MODE, SWANLAB_MODES)
    found["trackio_mode"] = _mode_variable(env.OTEL_RL_TRACKIO_MODE, TRACKIO_MODES)
    return found


def _mode_variable(variable: str, modes: tuple[str, ...]) -> str | None:
    raw = os.environ.get(variable, "").strip().lower() or None
    mode = _ALIASES.get(raw, raw) if raw is not None and variable == env.SWANLAB_MODE else raw
    if mode is not None and mode not in modes:
        env.warn_invalid(variable, raw or "", " or ".join(modes))
        return None
    return mode


def wandb_tags(tags: Any) -> tuple[str, ...]:
    """``wandb_tags`` as a tuple of tags (a comma-separated string is split); each one 1 to 64 characters, as W&B takes."""
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise TypeError(f"wandb_tags must be a list of strings, got {tags!r}")
    bad = [t for t in tags if not 0 < len(t) <= 64 or clean_text(t) != t]
    if bad:
        raise ValueError(f"wandb_tags: each tag is 1 to 64 characters of valid text, got {bad[0][:80]!r}")
    return tuple(dict.fromkeys(tags))  # W&B keeps one of each


def mode(option: str, value: Any, modes: tuple[str, ...]) -> str | None:
    """``value`` of the mode option ``option`` checked against ``modes`` (None: decided from the tracker's key or place)."""
    if value is None:
        return None
    name = value.strip().lower() if isinstance(value, str) else None
    name = _ALIASES.get(name, name) if option == "swanlab_mode" else name
    if name not in modes:
        close = difflib.get_close_matches(str(value), modes, n=1)
        raise ValueError(f"{option} must be {', '.join(modes)}, got {value!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
    return name


def default_modes(options: Any) -> None:
    """Settle the trackers' modes on ``options`` (a :class:`otel_rl.TelemetryConfig`): ``disabled`` switches the
    output off; an unset mode is online only where the tracker's key or place is given."""
    for tracker, key_variables, online, offline in (
        ("wandb", (env.WANDB_API_KEY,), "online", "offline"),
        ("swanlab", (env.SWANLAB_API_KEY,), "online", "offline"),
        ("trackio", (env.TRACKIO_SPACE_ID, env.TRACKIO_SERVER_URL), "online", "local"),
    ):
        chosen = getattr(options, f"{tracker}_mode")
        if chosen == "disabled":
            setattr(options, tracker, False)  # the tracker's own way of saying "no run": the output is left out
        elif getattr(options, tracker) and chosen is None:
            setattr(options, f"{tracker}_mode", online if any(os.environ.get(v) for v in key_variables) else offline)
    if options.trackio and options.trackio_mode == "online" and not any(os.environ.get(v) for v in (env.TRACKIO_SPACE_ID, env.TRACKIO_SERVER_URL)):
        raise ValueError(f"trackio_mode='online' needs a place to log to: set {env.TRACKIO_SPACE_ID} (a Hugging Face Space) or {env.TRACKIO_SERVER_URL}")

"""What a run is: its configuration and provenance, the same on every backend.

:func:`collect` gathers, once when the run starts, the git commit, branch and
dirty flag of the working directory, the command line (the values of
secret-looking options, ``--api-key=...`` or ``--token ...``, redacted), the
host, and the versions of Python, otel-rl and the ML stack. The configuration (already JSON-safe)
has the values under keys that look like secrets replaced by
:data:`REDACTED` (:func:`redact`), everywhere it goes: ``run_config.json``,
the ``running`` record, the ``rl.run`` span's attributes (``rl.config.*``,
flattened by :func:`flatten`) and the ``rl.run.info`` metric's labels, so
Prometheus and Grafana can join runs with their settings.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from typing import Any

REDACTED = "<redacted>"
SECRET_KEY = re.compile(
    r"(?i)(^|[^a-z])(token|passw(or)?d|secrets?|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|auth|authorization)($|[^a-z])"
)
"""Keys whose values are never exported (``wandb_api_key``, ``db_password``, ``hf_token``), as whole words
(``max_tokens`` and ``author`` are kept)."""
MAX_INFO_LABELS = 64
"""Configuration values carried as ``rl.run.info`` labels (the first, in key order)."""


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_secret(key: str) -> bool:
    """Whether a key names a secret (camelCase counts as separate words: ``wandbApiKey``)."""
    return SECRET_KEY.search(_CAMEL.sub("_", key)) is not None


def redact(document: Any) -> Any:
    """A copy of a JSON document with the values under secret-looking keys replaced by :data:`REDACTED`."""
    if isinstance(document, dict):
        return {k: (REDACTED if v is not None and is_secret(k) else redact(v)) for k, v in document.items()}
    if isinstance(document, list):
        return [redact(v) for v in document]
    return document


def flatten(document: Any, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 3e-4}}`` as ``{"optim.lr": 3e-4}``; lists of plain values are kept, others become text."""
    out: dict[str, Any] = {}
    if isinstance(document, dict):
        for key, value in document.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(document, list) and all(isinstance(v, (bool, int, float, str)) for v in document):
        out[prefix] = list(document)
    elif isinstance(document, list):
        out[prefix] = str(document)
    elif document is not None:
        out[prefix] = document
    return out


def package_versions() -> dict[str, str]:
    """Versions worth knowing when reading a run: Python, otel-rl, and the ML stack if loaded."""
    from otel_rl.version import __version__

    versions = {"python": platform.python_version(), "otel_rl": __version__}
    for name in ("torch", "numpy", "gymnasium", "stable_baselines3", "torchrl", "ray"):
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "__version__", None), str):
            versions[name] = str(module.__version__)  # torch's is a str subclass of its own: plain text travels anywhere
    return versions


def git_state(timeout_s: float = 1.0) -> dict[str, Any] | None:
    """``{"commit", "branch", "dirty"}`` of the working directory's git checkout (``branch`` None when detached), or None outside one (or without git)."""
    try:
        lines = subprocess.run(
            ["git", "rev-parse", "HEAD", "--abbrev-ref", "HEAD"], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout.split()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    commit = lines[0] if lines else ""
    branch = lines[1] if len(lines) > 1 and lines[1] != "HEAD" else None
    return {"commit": commit, "branch": branch, "dirty": bool(status.strip())} if commit else None


def collect() -> dict[str, Any]:
    """The provenance of this process's run: git, command line (and its program, arguments and working directory), host, versions."""
    args = redact_args(sys.argv[1:])
    return {
        "git": git_state(),
        "command": shlex.join([sys.argv[0], *args]) if sys.argv and sys.argv[0] else sys.executable,
        "program": _program(),
        "args": args,
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "versions": package_versions(),
    }


def redact_args(args: list[str]) -> list[str]:
    """A command line's arguments with the values of secret-looking options redacted: ``--api-key=x``, ``--token x``, ``wandb.api_key=x``."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, args):
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, equals, _ = arg.partition("=")
        option = name.lstrip("-")
        if equals and option and is_secret(option.rsplit(".", 1)[-1]):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(arg)
            hide_next = arg.startswith("-") and not equals and bool(option) and is_secret(option)
    return out


def _program() -> str | None:
    """The training script's path (or ``-m module``), as W&B and the like name a run's program; None in an interactive session."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path:
        return os.path.abspath(path)
    spec = getattr(main, "__spec__", None)
    return f"-m {spec.name}" if spec is not None else None


def info_labels(config: dict[str, Any] | None, provenance: dict[str, Any]) -> dict[str, str]:
    """Attributes of the ``rl.run.info`` gauge: the commit and the (flattened) configuration as text.

    The run id is on the resource (and so on every series) already.
    """
    labels: dict[str, str] = {}
    git = provenance.get("git") or {}
    if git.get("commit"):
        labels["rl.git.commit"] = git["commit"]
        labels["rl.git.dirty"] = str(git["dirty"]).lower()
        if git.get("branch"):
            labels["rl.git.branch"] = git["branch"]
    for key, value in list(flatten(config or {}).items())[:MAX_INFO_LABELS]:
        labels[f"rl.config.{key}"] = str(value)[:200]
    return labels


def span_attributes(config: dict[str, Any] | None, provenance: dict[str, Any]) -> dict[str, Any]:
    """Attributes of the ``rl.run`` span: the flattened configuration and the provenance, as OpenTelemetry values."""
    attributes: dict[str, Any] = {}
    for key, value in flatten(config or {}).items():
        if isinstance(value, list) and len({type(v) for v in value}) > 1:
            value = str(value)  # OpenTelemetry arrays hold one type
        attributes[f"rl.config.{key}"] = value
    git = provenance.get("git") or {}
    if git.get("commit"):
        attributes["rl.git.commit"] = git["commit"]
        attributes["rl.git.dirty"] = bool(git["dirty"])
        if git.get("branch"):
            attributes["rl.git.branch"] = git["branch"]
    if provenance.get("command"):
        attributes["process.command_line"] = provenance["command"]
    if provenance.get("host"):
        attributes["host.name"] = provenance["host"]
    return attributes

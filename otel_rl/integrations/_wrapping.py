"""How the integrations time a library's methods: wrappers set on the instances they instrument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_rl import schema


def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``owner.name`` by ``make(original)`` on the instance; returns the function that undoes it."""
    original = getattr(owner, name)
    had_own = name in getattr(owner, "__dict__", {})
    setattr(owner, name, make(original))

    def undo() -> None:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    return undo


def timed(tel: Any, phase: str, method: Callable[..., Any], timeline: str = schema.COLLECTOR) -> Callable[..., Any]:
    """``method`` recorded as ``phase`` of ``timeline`` on every call (also when it raises)."""
    recorded = tel.phase(phase, timeline)  # resolved once: entering it costs a fraction of record_phase

    def call(*args: Any, **kwargs: Any) -> Any:
        with recorded:
            return method(*args, **kwargs)

    return call

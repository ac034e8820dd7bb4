"""Scalar steps that go back: recorded as given, and reported once per key."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from otel_rl.base.log import logger

_logger = logger(__name__)

MAX_REPORTED_KEYS = 20
"""Keys a ``step_regression`` event names at most."""


class StepCheck:
    """Reports a scalar key whose step went back, once per key (pipeline thread).

    Args:
        last_steps: each key's last step so far (a resumed run's, from :func:`previous_run`).
    """

    def __init__(self, last_steps: dict[str, int] | None = None) -> None:
        self._last = dict(last_steps or {})
        self._highest = max(self._last.values(), default=None)
        self._reported: set[str] = set()

    def rises(self, step: int, keys: Iterable[str] | None = None) -> bool:
        """Whether no key went back at ``step``; ``step`` becomes the highest when it is at or above every step so far.

        At or above every step so far, no key can have gone back (the common case, one comparison).
        Below it, False unless ``keys`` are given; then each of them is compared with its own last
        step: records made beside the run (system metrics on the env-steps axis) and a loop's
        scalars on its own ``step=`` keep separate axes, and neither takes the other off the block
        path. The caller has noted every earlier record's steps (:meth:`note`) before asking about ``keys``.
        """
        if self._highest is None or step >= self._highest:
            self._highest = step
            return True
        if keys is None:
            return False
        last = self._last
        return all(last.get(key, step) <= step for key in keys)

    def note(self, steps: dict[str, int]) -> None:
        """Each key's last step, from records whose steps :meth:`rises` accepted (the same as checking each in turn)."""
        self._last.update(steps)

    def check(self, values: dict[str, Any], step: int) -> dict[str, Any] | None:
        """Note ``step``, one :meth:`rises` refused, for ``values``' keys; the attributes of a ``step_regression`` event when some went back for the first time."""
        last = self._last
        back = [k for k in values if last.get(k, step) > step]
        previous = max((last[k] for k in back), default=None)
        last.update(dict.fromkeys(values, step))
        if not back:
            return None
        new = [k for k in back if k not in self._reported]
        if not new:
            return None
        self._reported.update(new)
        _logger.warning(
            "otel-rl: step %d is lower than the last step %d of %s; recorded as given (step_regression event)",
            step,
            previous,
            ", ".join(new[:3]) + (" ..." if len(new) > 3 else ""),
        )
        return {"keys": new[:MAX_REPORTED_KEYS], "step": step, "last_step": previous}

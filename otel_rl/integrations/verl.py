"""verl: ``instrument(tel)`` in the process that runs the trainer's ``fit()`` (verl's driver, its ``TaskRunner``).

verl times each step of its PPO trainer with ``marked_timer`` into ``timing_raw`` (``gen``, ``reward``,
``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``, ``update_weights``, ``step``) and
hands ``timing_s/<name>`` (and everything else it measured) to its trackers through ``Tracking.log``. otel-rl comes in
there, wrapping ``verl.utils.tracking.Tracking.log`` (the class's: the trainer builds its ``Tracking`` inside
``fit()``), so whichever backends the run configured (``trainer.logger``: W&B, TensorBoard, SwanLab...) go on as they
are, with no second run of any:

- verl's ``marked_timer`` (``verl.utils.profiler``, ``verl.utils.debug``, and the trainers that imported it) also
  makes each timer a phase as it runs, and ``step`` the learner iteration: the trace holds the step as it happened;
- otherwise (another trainer, a recipe that times itself), each logged step is laid out from its durations in the
  order verl runs them, ending when it was logged, and the trace says so once (a ``timeline_rebuilt`` event);
- the phases take their canonical names (:data:`PHASES`: ``gen`` is ``generation``, ``ref`` is ``ref_log_prob``,
  ``update_actor`` is ``learning``...), so the shares and the verdict read as for any other run;
- every other metric is a scalar at verl's step, under canonical keys where there is one
  (``otel_rl.formats.schema.LIBRARY_TAGS["verl"]``: ``perf/throughput`` is ``Perf/tokens_per_s``...), the rest under
  ``verl/`` (``timing_per_token_ms/*`` kept as they are).

A step logged while no run is open opens one (the process's ``tel.close()`` ends it). The wrapper is undone by the
function ``instrument`` returns.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.base import extras
from otel_rl.base.log import logger, once

extras.require(extras.INTEGRATIONS["verl"])

from verl.utils import profiler as _profiler
from verl.utils import tracking as _tracking

from otel_rl.formats import schema

SYSTEM = "verl"
"""``rl.system`` of runs trained with verl."""

PHASES = {
    "gen": "generation",
    "reward": "reward",
    "old_log_prob": "old_log_prob",
    "ref": "ref_log_prob",
    "values": "values",
    "adv": "advantage",
    "update_critic": "critic_update",
    "update_actor": "learning",
    "update_weights": "weight_publish",
}
"""verl's timers and the canonical phases they are."""
ORDER = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
"""The order verl's PPO trainer runs them in a step (what a step rebuilt from durations follows)."""
STEP = "step"
TIMING = "timing_s/"

_logger = logger(__name__)
_NAME = re.compile(r"[^a-z0-9_]+")


def phase_name(timer: str) -> str:
    """The phase of one of verl's timers: its canonical name, else the timer's name in snake case."""
    known = PHASES.get(timer)
    if known is not None:
        return known
    cleaned = _NAME.sub("_", timer.lower()).strip("_")
    return (cleaned if cleaned[:1].isalpha() else "verl_" + cleaned)[:63] or "verl_timer"


class _Steps:
    """What one process's verl steps recorded: live steps (verl's timers seen) and rebuilt ones."""

    def __init__(self, tel: TrainingTelemetry) -> None:
        self.tel = tel
        self.live = 0
        """Steps recorded live since the last log (their durations are not laid out again)."""
        self.index = 0
        self.rebuilt_said = False
        self.last_end = 0

    def log(self, data: dict[str, Any], step: int | None) -> None:
        """A step's metrics, as verl logs them: its timings as a step (unless recorded live), the rest as scalars."""
        if not isinstance(data, dict):
            return
        self.tel.start_run(family="rl.onpolicy")  # a no-op when a run is open
        plain = {key: number for key, value in data.items() if isinstance(key, str) and (number := _scalar(key, value)) is not None}
        timings = {key[len(TIMING):]: value for key, value in plain.items() if key.startswith(TIMING) and math.isfinite(value)}
        if timings and not self.live:
            self._rebuild(timings, step)
        self.live = 0
        # The rest as scalars, and a timing that is NaN or infinite too (its nonfinite event says it; the step is laid
        # out from the others).
        values = {schema.library_key("verl", key): value for key, value in plain.items() if not key.startswith(TIMING) or not math.isfinite(value)}
        if values:
            self.tel.scalars(values, step=step)

    def _rebuild(self, timings: dict[str, float], step: int | None) -> None:
        """The step laid out from its durations in verl's order, ending now (it is logged as it ends)."""
        end = time.perf_counter_ns()
        names = [n for n in ORDER if n in timings] + sorted(n for n in timings if n not in PHASES and n != STEP)
        total = sum(max(float(timings[n]), 0.0) for n in names)
        wall = max(float(timings.get(STEP, total)), total)  # parts that overlapped (an async reward) never outgrow the step
        start = max(end - int(wall * 1e9), self.last_end)  # never over the previous step (a log that came late, then one early)
        self.last_end = end
        phases, at = [], start
        for name in names:
            length = int(max(float(timings[name]), 0.0) * 1e9)
            phases.append((phase_name(name), at, min(at + length, end)))
            at = min(at + length, end)
        index = step if isinstance(step, int) and not isinstance(step, bool) else self.index
        self.tel.record_iteration(index, start, end, phases)
        self.index = index + 1
        if not self.rebuilt_said:
            self.rebuilt_said = True
            self.tel.event("timeline_rebuilt", source="verl timing_s", order=",".join(phase_name(n) for n in ORDER),
                           note="steps laid out from the durations verl logged, in the order it runs them, ending when logged")  # fmt: skip

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """One of verl's timers as it runs: ``step`` as the learner iteration, the others as phases."""
        if name == STEP:
            with self.tel.iteration(self.index):
                yield
            self.index += 1
            self.live += 1
            return
        with self.tel.phase(phase_name(name)):
            yield


def _scalar(key: str, value: Any) -> float | None:
    """A metric's value as a number: a number, or a tensor or array of one value (0-d, or one element); None otherwise.

    A tensor of several values is said once (verl's trackers take one number too)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    if size is None or not hasattr(value, "item"):
        return None
    try:
        count = size() if callable(size) else int(size)
        if count != 1:
            _logger.warning("otel-rl: verl metric %r holds %d values, not one; it is not recorded", key[:200], count, extra=once(f"verl-many:{key[:200]}"))
            return None
        number = value.item()
    except Exception:  # an object that only looks like a tensor
        return None
    return float(number) if isinstance(number, numbers.Real) and not isinstance(number, bool) else None


def instrument(tel: TrainingTelemetry) -> Callable[[], None]:
    """Record verl's steps and metrics with ``tel`` (see the module); returns the function that undoes it."""
    steps = _Steps(tel)
    tel.describe_system(SYSTEM)
    original_log = getattr(_tracking.Tracking.log, "__otel_rl_original__", _tracking.Tracking.log)  # instrumented again: replaced

    def log(self: Any, data: Any, step: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            steps.log(data, step)
        except Exception as exc:  # never into training: one line
            _logger.warning("otel-rl: a verl step could not be recorded (%s: %s)", type(exc).__name__, str(exc)[:200], extra=once("verl-step"))
        return original_log(self, data, step, *args, **kwargs)

    log.__otel_rl_original__ = original_log  # type: ignore[attr-defined]
    _tracking.Tracking.log = log  # type: ignore[method-assign]
    undo = [lambda: setattr(_tracking.Tracking, "log", original_log)]
    current = getattr(_profiler, "marked_timer", None)
    original_timer = getattr(current, "__otel_rl_original__", current)
    if original_timer is not None:

        @contextmanager
        def marked_timer(name: str, timing_raw: dict, *args: Any, **kwargs: Any) -> Iterator[None]:
            with original_timer(name, timing_raw, *args, **kwargs), steps.timer(name):
                yield

        marked_timer.__otel_rl_original__ = original_timer  # type: ignore[attr-defined]

        # verl's trainers import it by name (``from verl.utils.debug import marked_timer``): the modules that export it
        # now, and those of verl that hold it already (a trainer imported before this call), get the wrapper.
        for module in [module for name, module in list(sys.modules.items()) if name == "verl" or name.startswith("verl.")]:
            if getattr(module, "marked_timer", None) in (original_timer, current):
                module.marked_timer = marked_timer
                undo.append(lambda module=module: setattr(module, "marked_timer", original_timer))

    def uninstrument() -> None:
        for step in reversed(undo):
            step()

    return uninstrument

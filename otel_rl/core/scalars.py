"""``scalars()`` calls into batches: keys and values checked, steps watched, each stretch of one key set one batch.

A packed stretch of calls of one key set (:class:`otel_rl.core.scalar_rows.ScalarRows`)
whose keys are exported as they are, whose values are finite and whose steps
rise becomes a :class:`~otel_rl.core.batches.ScalarBatch` straight from its
columns. Any other call is checked key by key and value by value
(:class:`~otel_rl.core.keys.KeyPolicy`, :func:`otel_rl.base.values.scalar_number`),
and consecutive calls of one key set are batched after it. A step that goes
back is recorded as given and reported once per key (a ``step_regression``
event after its call); a value that is not finite is exported as None with
one ``nonfinite`` event per key (before its call).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator

from otel_rl.base.log import logger
from otel_rl.base.values import INT64_MAX, INT64_MIN, as_step, describe, scalar_number
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.keys import KeyPolicy
from otel_rl.core.records import EventRecord, ScalarsRecord
from otel_rl.core.scalar_rows import ScalarRows
from otel_rl.core.step_check import StepCheck

_logger = logger(__name__)
WARN_NONFINITE_KEYS = 3
"""Keys whose first NaN or infinity is also a warning (the rest are their ``nonfinite`` events only)."""
_PLAIN_NUMBERS = frozenset((float, int))


class ScalarAssembler:
    """Turns one pass's ``scalars()`` calls into batches and events, in order (see the module docstring).

    Args:
        keys: the producer's key policy.
        seq: the writer's sequence counter.
        step_check: reports steps that go back (a resumed run's starts from its last steps).
        offset_ns: the producer's ``perf_counter_ns()`` to epoch offset.
    """

    def __init__(self, keys: KeyPolicy, seq: Iterator[int], step_check: StepCheck, offset_ns: int) -> None:
        self.keys = keys
        self.step_check = step_check
        self.seen_nonfinite: set[str] = set()
        self._seq = seq
        self._offset_ns = offset_ns
        self._pending: list[ScalarsRecord] = []
        self._out: list[ScalarBatch | EventRecord] = []

    def take(self) -> list[ScalarBatch | EventRecord]:
        """What the calls given since the last take became, in order."""
        self._hand_over()
        out, self._out = self._out, []
        return out

    def rows(self, table: ScalarRows) -> None:
        """Packed calls of one key set: as one batch in the steady state, else call by call."""
        names = table.names
        canonical = self.keys.accept_all(names)
        steps = table.axis_steps()
        if canonical and all(table.finite) and self._rises(names, steps):
            self._hand_over()
            seqs = list(itertools.islice(self._seq, len(steps)))
            self._out.append(ScalarBatch(names, table.times_ns + self._offset_ns, table.values, table.steps, table.iterations, table.env_steps, seqs))
            self.step_check.note(dict.fromkeys(names, steps[-1]))
            return
        columns = zip(table.times_ns.tolist(), table.values.tolist(), table.finite, table.steps, table.iterations, table.env_steps)
        for time_ns, row, finite, step, iteration, env_steps in columns:
            values = dict(zip(names, row))
            if canonical and finite:
                self.record(ScalarsRecord(time_ns + self._offset_ns, values, step, iteration, env_steps, next(self._seq)))
            else:
                self.call((time_ns, values, step, iteration, env_steps))

    def call(self, raw: tuple) -> None:
        """One call as recorded, ``(time_ns, values, step, iteration, env_steps)`` (``perf_counter_ns()`` time), checked."""
        time_ns, values, step, iteration, env_steps = raw
        step, iteration, env_steps = checked_axes(step, iteration, env_steps)
        if values.keys() <= self.keys.canonical and _plain_finite(values.values()):
            # Keys exported as they are, finite plain numbers: the dict is the call's own snapshot, used as is.
            self.record(ScalarsRecord(time_ns + self._offset_ns, values, step, iteration, env_steps, next(self._seq)))
            return
        clean: dict[str, float | int | None] = {}
        for raw_key, value in values.items():
            key = self.keys.key(raw_key)
            if not key:
                continue
            cleaned, is_number = scalar_number(key, value)
            if not is_number:
                continue
            clean[key] = cleaned
            if cleaned is None:
                self.nonfinite(key, time_ns + self._offset_ns, describe(value))
        self.record(ScalarsRecord(time_ns + self._offset_ns, clean, step, iteration, env_steps, next(self._seq)))

    def record(self, record: ScalarsRecord) -> None:
        """A checked record: batched with the calls of its key set around it; one whose step went back goes alone, with its event."""
        if not record.values:
            return
        step = record.axis_step
        if step is None or self.step_check.rises(step):
            if self._pending and self._pending[-1].values.keys() != record.values.keys():
                self._hand_over()
            self._pending.append(record)
            return
        self._hand_over()  # the records before it first, their steps noted
        if self.step_check.rises(step, record.values):  # below another axis's highest step, not below its keys' own
            self._pending.append(record)
            return
        self._out.append(ScalarBatch.of([record]))
        regression = self.step_check.check(record.values, step)
        if regression is not None:
            self._out.append(EventRecord(record.time_ns, "step_regression", regression, next(self._seq)))

    def nonfinite(self, key: str, time_ns: int, value: str) -> None:
        """One ``nonfinite`` event per key (``time_ns``: epoch), after the calls before it."""
        if key in self.seen_nonfinite:
            return
        self.seen_nonfinite.add(key)
        if len(self.seen_nonfinite) <= WARN_NONFINITE_KEYS:  # a collapsed reward or loss: the first thing to see
            more = " (more keys that go non-finite: their nonfinite events)" if len(self.seen_nonfinite) == WARN_NONFINITE_KEYS else ""
            _logger.warning("otel-rl: %s is %s; recorded as null, with a nonfinite event%s", key, value, more)
        self._hand_over()
        self._out.append(EventRecord(time_ns, "nonfinite", {"key": key, "value": value}, next(self._seq)))

    def _hand_over(self) -> None:
        """The pending records as one batch, and their steps noted."""
        if not self._pending:
            return
        records, self._pending = self._pending, []
        batch = ScalarBatch.of(records)
        self._out.append(batch)
        steps = batch.axis_steps()
        if None not in steps:  # each key's last step is that of the last record
            self.step_check.note(dict.fromkeys(batch.names, steps[-1]))
            return
        for record, step in zip(records, steps):
            if step is not None:
                self.step_check.note(dict.fromkeys(record.values, step))

    def _rises(self, names: tuple[str, ...], steps: list[int | None]) -> bool:
        """Whether every row's axis step is given and none goes back, for ``names`` (then :meth:`StepCheck.rises` took the last)."""
        if None in steps or any(a > b for a, b in zip(steps, steps[1:])):
            return False
        check = self.step_check
        if not check.rises(steps[0]):
            self._hand_over()  # the pending records' steps noted before ``names``' own are compared
            if not check.rises(steps[0], names):
                return False
        check.rises(steps[-1])
        return True


def _plain_finite(values: Iterable[object]) -> bool:
    """Every value an int of the signed 64-bit range or a finite float, checked by C loops (no Python loop per value)."""
    values = list(values)
    types = set(map(type, values))
    if not types <= _PLAIN_NUMBERS:
        return False
    if int in types and not INT64_MIN <= min(values) <= max(values) <= INT64_MAX:
        return False  # an int past 64 bits goes out as a float (the slow path), as in documents
    try:
        total = sum(values)  # inf or nan if any value is, or if the floats overflow (then the slow path decides)
    except OverflowError:  # an int too large for a float
        return False
    return type(total) is int or math.isfinite(total)


def in_range(value: int | None, fallback: int | None) -> int | None:
    """``value`` if it is in the signed 64-bit range the protocol carries, else ``fallback`` (one warning)."""
    if value is None or INT64_MIN <= value <= INT64_MAX:
        return value
    as_step(value, "a step or iteration index")  # warns
    return fallback


def checked_axes(step: int | None, iteration: int | None, env_steps: int | None) -> tuple[int | None, int | None, int | None]:
    """A record's step axes, each kept only if in the signed 64-bit range (Python ints are checked here, off the training thread)."""
    for axis in (step, iteration, env_steps):
        if axis is not None and not INT64_MIN <= axis <= INT64_MAX:
            return in_range(step, None), in_range(iteration, None), in_range(env_steps, None)
    return step, iteration, env_steps

"""Which records become OpenTelemetry spans, decided once where they are assembled.

Phase spans go out under a budget (``span_budget_per_s``): above it whole
iterations are left out, never parts of one. The pipeline decides here, as
it assembles a pass, and gives each record it keeps a span id: the span sink
exports those records, and the aggregates keep them as the exemplars of their
histograms, so both read the same decision and neither depends on the other.
"""

from __future__ import annotations

import numpy as np

_IDS = np.random.default_rng()


def span_ids(count: int) -> np.ndarray:
    """``count`` random span ids, none zero (the invalid id)."""
    return _IDS.integers(1, 2**64, size=count, dtype=np.uint64, endpoint=False)


class SpanBudget:
    """Token bucket of phase spans per second (burst: one second's worth).

    An iteration of more phases than one second's worth (an env runner's
    sample call of thousands of steps) goes out whole when the bucket is
    full, and leaves it in debt: the ones after it wait until the rate has
    paid for it, so the sustained rate holds and no iteration is too large
    ever to be sent.

    Args:
        spans_per_s: sustained rate; ``0`` sends no phase spans, ``inf`` all.
    """

    def __init__(self, spans_per_s: float) -> None:
        if not spans_per_s >= 0:
            raise ValueError(f"span budget must be >= 0 spans per second, got {spans_per_s!r}")
        self.rate = spans_per_s
        self._tokens = spans_per_s
        self._last_s: float | None = None
        self.sampled_out = 0

    def take(self, count: int, now_s: float) -> bool:
        """Spend ``count`` tokens if available; otherwise count the miss."""
        if self.rate == float("inf"):
            return True
        if self._last_s is not None:
            self._tokens = min(self.rate, self._tokens + (now_s - self._last_s) * self.rate)
        self._last_s = now_s
        if self._affords(self._tokens, count):
            self._tokens -= count
            return True
        self.sampled_out += count
        return False

    def take_each(self, counts: list[int], now_s: float) -> list[int]:
        """:meth:`take` of each of ``counts`` in turn, at one time: the indices of those that got their tokens."""
        if self.rate == float("inf"):
            return list(range(len(counts)))
        self.take(0, now_s)  # the refill
        taken, tokens = [], self._tokens
        fewest = min(counts, default=0)
        for index, count in enumerate(counts):
            if not self._affords(tokens, fewest):  # nothing more fits: the rest are sampled out at once
                break
            if self._affords(tokens, count):
                tokens -= count
                taken.append(index)
        self._tokens = tokens
        self.sampled_out += sum(counts) - sum(counts[i] for i in taken)
        return taken

    def _affords(self, tokens: float, count: int) -> bool:
        """``count`` spans fit in ``tokens``, or they are more than a full bucket holds and the bucket is full."""
        return self.rate > 0 and tokens >= min(count, self.rate)


class SpanSampler:
    """Span ids for the records a pass assembles: within the budget when spans are exported, none otherwise.

    Args:
        budget: the phase-span budget; None when no span is exported (every id is 0).
    """

    def __init__(self, budget: SpanBudget | None) -> None:
        self.budget = budget

    @property
    def sampled_out(self) -> int:
        return 0 if self.budget is None else self.budget.sampled_out

    def iterations(self, counts: np.ndarray, now_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Ids of iterations with ``counts[i]`` phases each (nested ones included), each kept or left out whole.

        Returns one id per iteration and one per phase (the phases in order), 0 where left out.
        """
        kept = self._kept(counts + 1, now_s)
        return self._ids(len(counts), kept), self._members(counts, kept)

    def trees(self, sizes: np.ndarray, now_s: float) -> np.ndarray:
        """Ids of phases outside iterations: ``sizes[i]`` phases make the ``i``-th top-level one and those nested in it,
        kept or left out whole. One id per phase, in order, 0 where left out."""
        return self._members(sizes, self._kept(sizes, now_s))

    def _kept(self, costs: np.ndarray, now_s: float) -> list[int]:
        if self.budget is None or not len(costs):
            return []
        return self.budget.take_each(costs.tolist(), now_s)

    @staticmethod
    def _ids(count: int, kept: list[int]) -> np.ndarray:
        ids = np.zeros(count, dtype=np.uint64)
        if kept:
            ids[kept] = span_ids(len(kept))
        return ids

    @staticmethod
    def _members(sizes: np.ndarray, kept: list[int]) -> np.ndarray:
        ids = np.zeros(int(sizes.sum()), dtype=np.uint64)
        if kept:
            bounds = np.concatenate(([0], np.cumsum(sizes)))
            chosen = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in kept])
            ids[chosen] = span_ids(len(chosen))
        return ids

    def one(self, now_s: float) -> int:
        """The id of one record kept alone (a GPU interval), 0 when it is left out."""
        if self.budget is None or not self.budget.take(1, now_s):
            return 0
        return int(span_ids(1)[0])

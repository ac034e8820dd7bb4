"""Per rank, from a trace: each rank's phase table and each rank's throughput.

A timeline recorded by several ranks (the learner of a ``torchrun`` job) gets
one table per rank beside the pooled one, from which
:func:`otel_rl.formats.diagnosis.straggler` names the rank whose phase exceeds the
median rank's the most: which rank, on which host, in which phase, by how
much, and the phase where the other ranks wait for it (their all-reduce,
mostly). Ranks are told apart by their process names
(:func:`otel_rl.formats.trace.parse_process`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from otel_rl.formats import trace
from otel_rl.formats.report import RankTimeline, Timeline
from otel_rl.readers.analysis.trace_model import Slice

RESTART_GAP_S = 60.0
"""Iterations further apart than this are parts of a resumed run: the time between them is not training."""


def by_rank(slices: list[Slice]) -> dict[int, list[Slice]]:
    """``slices`` grouped by the rank of their process."""
    out: dict[int, list[Slice]] = {}
    for s in slices:
        out.setdefault(trace.parse_process(s.process)[1], []).append(s)
    return out


def rank_tables(cycles: list[Slice], phases: list[Slice], table: Callable[[list[Slice], list[Slice]], Timeline]) -> tuple[RankTimeline, ...]:
    """One table per rank (what ``table`` makes of its cycles and phases, with its rank and host); none for one rank."""
    cycles_of, phases_of = by_rank(cycles), by_rank(phases)
    ranks = sorted(set(cycles_of) | set(phases_of))
    if len(ranks) < 2:
        return ()
    out = []
    for rank in ranks:
        own = cycles_of.get(rank) or phases_of[rank]
        host = trace.parse_process(own[0].process)[2]
        entry = table(cycles_of.get(rank, []), phases_of.get(rank, []))
        out.append(RankTimeline(**{f.name: getattr(entry, f.name) for f in dataclasses.fields(Timeline)}, rank=rank, host=host))
    return tuple(out)


def throughput(iterations: list[Slice]) -> tuple[float | None, dict[int, float]]:
    """Env steps per second of the job and of each rank, from the iterations that carry a count.

    Each rank's steps count once (between its own consecutive iterations;
    gaps over :data:`RESTART_GAP_S` are not training); the job's is the sum of
    the ranks' steps over the longest rank's time.
    """
    steps_of: dict[int, tuple[float, float]] = {}
    for rank, own in by_rank([s for s in iterations if s.env_steps is not None]).items():
        own.sort(key=lambda s: s.start_ns)
        steps = seconds = 0.0
        for before, after in zip(own, own[1:]):
            elapsed = (after.start_ns - before.start_ns) / 1e9
            if 0 < elapsed <= RESTART_GAP_S and after.env_steps >= before.env_steps:  # type: ignore[operator]
                steps += after.env_steps - before.env_steps  # type: ignore[operator]
                seconds += elapsed
        if seconds:
            steps_of[rank] = (steps, seconds)
    if not steps_of:
        return None, {}
    job = sum(steps for steps, _ in steps_of.values()) / max(seconds for _, seconds in steps_of.values())
    return job, {rank: steps / seconds for rank, (steps, seconds) in steps_of.items()}

"""Per rank: each rank's phase table, each rank's throughput, and the job's straggler.

A timeline recorded by several ranks (the learner of a ``torchrun`` job) gets
one table per rank beside the pooled one, and the verdict names the rank
whose phase exceeds the median rank's the most: which rank, on which host,
in which phase, by how much, and the phase where the other ranks wait for it
(their all-reduce, mostly). Ranks are told apart by their process names
(:func:`otel_rl.formats.trace.parse_process`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from otel_rl.formats import schema, trace
from otel_rl.readers.analysis.report import RankTimeline, Straggler, Timeline
from otel_rl.readers.analysis.trace_model import Slice

STRAGGLER_RATIO = 1.2
"""A rank whose phase takes this many times the median rank's (per iteration) is a straggler."""
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


is_wait = schema.is_wait
"""Whether a phase is waiting for others, not work of its own (its one home: :func:`otel_rl.formats.schema.is_wait`)."""


def straggler(ranks: Sequence[RankTimeline], timeline: str = schema.LEARNER) -> Straggler | None:
    """The rank whose top-level phase of work most exceeds the median rank's, per iteration; None when no rank's is
    :data:`STRAGGLER_RATIO` times the median's or more (``ranks``: :func:`rank_tables`' entries).

    A rank that works longer makes the others wait in their collective, which then exceeds its median on them:
    with two ranks the two excesses are equal. A phase of waiting (:func:`is_wait`) therefore names a straggler
    only when no phase of work does: the rank that works longer is named, never the ones that wait for it.
    """
    if not ranks:
        return None
    per = {entry.rank: _per_iteration(entry) for entry in ranks}
    names = sorted(set().union(*per.values()))
    median = {name: statistics.median(own.get(name, 0.0) for own in per.values()) for name in names}

    def slow(rank: int, name: str) -> bool:
        excess = per[rank].get(name, 0.0) - median[name]
        return excess > 0 and not (median[name] > 0 and per[rank].get(name, 0.0) < STRAGGLER_RATIO * median[name])

    found = [(per[rank].get(name, 0.0) - median[name], not is_wait(name), rank, name) for rank in per for name in names if slow(rank, name)]
    work = [candidate for candidate in found if candidate[1]]
    _, _, rank, name = max(work or found, default=(0.0, False, None, None))
    if rank is None:
        return None
    excess = per[rank][name] - median[name]
    entry = next(e for e in ranks if e.rank == rank)
    titles = {n: s.title for e in ranks for n, s in e.phases.items()}
    others = [own for r, own in per.items() if r != rank]
    waits = {n: statistics.median(own.get(n, 0.0) for own in others) - per[rank].get(n, 0.0) for n in names if n != name}
    wait = max(waits, key=waits.get) if waits else None  # type: ignore[arg-type]
    others_wait_in = others_wait_ms = None
    if wait is not None and waits[wait] >= 0.5 * excess:  # the others spend at least half its excess waiting there
        others_wait_in, others_wait_ms = titles[wait], waits[wait]
    ratio = per[rank][name] / median[name] if median[name] else None
    line = _verdict(rank, entry.host, titles[name], ratio, per[rank][name], median[name], others_wait_in, others_wait_ms)
    return Straggler(
        rank=rank, host=entry.host, phase=name, title=titles[name], ms_per_iteration=per[rank][name],
        median_ms_per_iteration=median[name], ratio=ratio, others_wait_in=others_wait_in,
        others_wait_ms_per_iteration=others_wait_ms, verdict=line, timeline=timeline,
    )  # fmt: skip


def _per_iteration(entry: Timeline) -> dict[str, float]:
    cycles = entry.cycles or 1
    return {name: stat.total_ms / cycles for name, stat in entry.phases.items() if not stat.nested and not stat.background}


def _verdict(rank: int, host: str | None, title: str, ratio: float | None, ms: float, median_ms: float,
             others_wait_in: str | None, others_wait_ms: float | None) -> str:  # fmt: skip
    where = f"rank {rank}" + (f" on {host}" if host else "")
    times = f"{ratio:.1f}x the median rank" if ratio else "only this rank has it"
    line = f"{where}: {title} {times} ({ms:.2f} ms against {median_ms:.2f} ms per iteration)"
    if others_wait_in:
        line += f"; the others wait in their {others_wait_in} (+{others_wait_ms:.2f} ms per iteration)"
    return line


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

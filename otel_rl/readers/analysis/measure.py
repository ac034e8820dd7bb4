"""Where the time goes, measured from a trace: per-phase statistics, stalls, shares, overlap, GPU busy time, throughput.

:func:`measure` reads a :class:`TraceModel` (whichever engine read it) into a
:class:`~otel_rl.formats.report.Report` without its diagnosis;
:func:`analyze_model` adds the diagnosis of :mod:`.rules`.

A phase's statistics leave out its stalls: a rare occurrence far above its
median (over :data:`STALL_FACTOR` times it and :data:`STALL_MIN_MS`, at most
:data:`STALL_MAX_FRACTION` of the occurrences) is counted and shown as a
stall, never averaged into its phase, so one host stall cannot name a
bottleneck.
"""

from __future__ import annotations

import math
import dataclasses
from collections.abc import Callable

from otel_rl.formats import schema
from otel_rl.formats import diagnosis as rules
from otel_rl.readers.analysis import host, ranks
from otel_rl.readers.analysis.operators import operators_by_phase
from otel_rl.formats.report import CycleStats, PhaseStats, Regime, Report, Timeline, Turns
from otel_rl.readers.analysis.trace_model import Slice, TraceModel

STALL_FACTOR = 10.0
STALL_MIN_MS = 50.0
STALL_MAX_FRACTION = 0.02
"""Above this share of a phase's occurrences, long ones are its steady cost, not stalls."""
TRIM = 0.1
"""The trimmed mean leaves out this share of the occurrences at each end."""
MAX_SAMPLES = 1000
"""Per-cycle durations kept in the report (evenly spaced) for the comparison's significance test."""
_WAITS = schema.SIDE_WAITS
_TITLES = {(p.timeline, p.title): p.name for p in schema.PHASES.values()}


def phase_name(timeline: str, title: str) -> str:
    """A phase's name from its slice's title on ``timeline`` (the schema's name, else the title in snake case)."""
    return _TITLES.get((timeline, title), title.lower().replace(" ", "_"))


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the merged intervals ``a`` outside the merged intervals ``b``."""
    out: list[tuple[int, int]] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def _total(intervals: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if low < high:
            total += high - low
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def nearest_rank(ordered: list[float], q: float) -> float:
    """The value of rank ``ceil(q * n)`` of sorted values: the quantile the run summary estimates too."""
    return ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1]


def _stats(ms: list[float]) -> dict[str, float]:
    """Count, mean, standard deviation, median, trimmed mean, p95 and total of sorted durations (ms)."""
    mean = sum(ms) / len(ms)
    std = math.sqrt(sum((x - mean) ** 2 for x in ms) / (len(ms) - 1)) if len(ms) > 1 else 0.0
    cut = int(TRIM * len(ms))
    kept = ms[cut : len(ms) - cut]
    return {
        "count": len(ms), "mean_ms": mean, "std_ms": std, "p50_ms": nearest_rank(ms, 0.5),
        "trimmed_mean_ms": sum(kept) / len(kept), "p95_ms": nearest_rank(ms, 0.95), "total_ms": sum(ms),
    }  # fmt: skip


def _cycle_stats(durations_ns: list[int]) -> CycleStats:
    """A timeline's cycle statistics, with up to :data:`MAX_SAMPLES` of its durations (in order, evenly spaced)."""
    ms = [d / 1e6 for d in durations_ns]
    stride = max(1, math.ceil(len(ms) / MAX_SAMPLES))
    return CycleStats(**_stats(sorted(ms)), samples=tuple(round(x, 4) for x in ms[::stride]))


def _phase_stats(durations_ns: list[int], title: str, nested: bool, background: bool, wall_ns: int) -> PhaseStats:
    """A phase's statistics without its stalls, the stalls' count and time, and its share of ``wall_ns``."""
    ms = sorted(d / 1e6 for d in durations_ns)
    threshold = max(STALL_FACTOR * nearest_rank(ms, 0.5), STALL_MIN_MS)
    stalls = [x for x in ms if x > threshold]
    if len(stalls) > max(1, STALL_MAX_FRACTION * len(ms)):
        stalls = []  # long occurrences this common are how the phase runs
    steady = _stats(ms[: len(ms) - len(stalls)])
    return PhaseStats(
        **steady, stalls=len(stalls), stall_ms=sum(stalls), stall_max_ms=max(stalls, default=0.0), title=title, nested=nested,
        background=background, share=steady["total_ms"] * 1e6 / wall_ns if wall_ns else 0.0,
    )  # fmt: skip


def _throughput(iterations: dict[str, list[Slice]]) -> tuple[float | None, dict[int, float]]:
    """Env steps per second of the job and of each rank (:func:`ranks.throughput`), the learner's, else the collector's."""
    for timeline in (schema.LEARNER, schema.COLLECTOR):
        job, per_rank = ranks.throughput(iterations.get(timeline, []))
        if job is not None:
            return job, per_rank
    return None, {}


def _inside_itself(slices: list[Slice], s: Slice) -> bool:
    """A phase opened inside one of its own name (a library's wrapper and the loop's both time it): its time is the outer one's."""
    parent = s.parent
    while parent != -1:
        outer = slices[parent]
        if outer.name == s.name and outer.category == s.category:
            return True
        parent = outer.parent
    return False


def _timeline_entry(timeline: str, cycles: list[Slice], own: list[Slice], is_top: Callable[[Slice], bool]) -> tuple[Timeline, list[Slice]]:
    """A timeline's table (cycles, phases, accounted and other shares) from its cycles and phases, and its top-level phases."""
    # Top-level phases inside cycles (or all of them for a timeline without cycles).
    top = [s for s in own if is_top(s) and (s.parent != -1 or not cycles)]
    wall = sum(c.duration_ns for c in cycles) if cycles else sum(s.duration_ns for s in top)
    by_name: dict[str, list[Slice]] = {}
    for s in own:
        by_name.setdefault(phase_name(timeline, s.name), []).append(s)
    table = {}
    for name, occurrences in by_name.items():
        nested = not any(is_top(s) for s in occurrences)
        # Work on other threads, never inside this timeline's cycles: it overlaps them.
        background = bool(cycles) and not nested and all(s.parent == -1 for s in occurrences)
        table[name] = _phase_stats([s.duration_ns for s in occurrences], occurrences[0].name, nested, background, wall)
    accounted = sum(s.duration_ns for s in top)
    stalled = sum(stat.stall_ms for stat in table.values() if not stat.nested and not stat.background) * 1e6
    entry = Timeline(
        cycles=len(cycles),
        cycle_ms=_cycle_stats([c.duration_ns for c in cycles]) if cycles else None,
        phases=dict(sorted(table.items(), key=lambda kv: (kv[1].nested, -kv[1].total_ms))),
        accounted_share=(accounted - stalled) / wall if wall else 0.0,
        stall_share=stalled / wall if wall else 0.0,
        other_share=max(wall - accounted, 0) / wall if wall and cycles else 0.0,
    )
    return entry, top


def analyze_model(model: TraceModel) -> Report:
    """The analysis report of a trace: what :func:`measure` finds, with the diagnosis of :func:`.rules.diagnose`.

    A run of several regimes (:func:`regimes`: a start-up, a warm-up, a change of pace midway) is reported by its
    headline regime, the longest steady one: its tables and its diagnosis, never a blend with the warm-up; each
    regime is listed with its own verdict.
    """
    found = regimes(model)
    if len(found) < 2:
        report = measure(model)
        return dataclasses.replace(report, diagnosis=rules.diagnose(report))
    whole = measure(model)
    origin = min((s.start_ns for s in model.slices if s.category in schema.TIMELINES), default=0)
    listed, reports = [], []
    for part in found:
        report = measure(model, (part.lo_ns, part.hi_ns))
        diagnosis = rules.diagnose(report)
        if part.kind == START_UP:
            text, side, phase = f"start-up: {part.seconds:.1f} s in {_iterations(part)}", None, None
        else:
            text, side, phase = diagnosis.bottleneck, diagnosis.side, diagnosis.phase
        listed.append(Regime(kind=part.kind, first_iteration=part.first, last_iteration=part.last, cycles=part.cycles,
                             start_s=round((part.start_ns - origin) / 1e9, 3), seconds=round(part.seconds, 3), cycle_p50_ms=round(part.p50_ms, 3),
                             bottleneck=text, side=side, phase=phase))  # fmt: skip
        reports.append(dataclasses.replace(report, diagnosis=diagnosis))
    steady = [i for i, part in enumerate(found) if part.kind in (STEADY, CHANGED)]
    head = max(steady, key=lambda i: found[i].seconds)
    listed[head] = dataclasses.replace(listed[head], headline=True)
    return dataclasses.replace(reports[head], wall_s=whole.wall_s, regimes=tuple(listed))


START_UP = "start-up"
WARM_UP = "warm-up"
STEADY = "steady"
CHANGED = "changed"
START_UP_FACTOR = 10.0
"""A first cycle this many times the median of the rest (and over :data:`STALL_MIN_MS`) holds one-off costs: the start-up."""
START_UP_MAX_CYCLES = 3
WARM_UP_PRESENT = 0.9
"""A phase a run's first cycles lack and at least this share of every later cycle has ends its warm-up when it starts."""
MIN_REGIME_CYCLES = 20
"""A warm-up's steady state, and each side of a change, hold at least this many cycles."""
CHANGE_RATIO = 1.5
"""Two parts of a steady state whose median cycles differ by this factor are two regimes."""
SHIFT_SHARE = 0.25
"""Two parts of a steady state whose median wait (Collector Wait, a share of each cycle) differs by this much are two
regimes: the pace-setter changed sides at about the same cycle time."""


@dataclasses.dataclass(frozen=True)
class _Part:
    kind: str
    first: int
    last: int
    start_ns: int
    lo_ns: int
    hi_ns: int
    seconds: float
    p50_ms: float

    @property
    def cycles(self) -> int:
        return self.last - self.first + 1


def _iterations(part: _Part) -> str:
    return f"iteration {part.first}" if part.first == part.last else f"iterations {part.first}-{part.last}"


def regimes(model: TraceModel) -> list[_Part]:
    """The run's regimes from the cycles of its pace-setting timeline (the learner's, else the collector's; of the process with most).

    In order: a start-up (up to :data:`START_UP_MAX_CYCLES` first cycles each over :data:`START_UP_FACTOR` times
    the median), a warm-up (the cycles before a phase that the rest nearly all have begins: the learning after
    ``learning_starts``), then the steady state, cut in two where its median cycle changes by :data:`CHANGE_RATIO`,
    or else where its median wait (a share of the cycle) moves by :data:`SHIFT_SHARE`.
    One regime (a list of one, or none) when the run has none of these.
    """
    slices = model.slices
    cycles: list[tuple[int, Slice]] = []
    for timeline in (schema.LEARNER, schema.COLLECTOR):
        by_process: dict[str, list[tuple[int, Slice]]] = {}
        for index, s in enumerate(slices):
            if s.category == timeline and s.name == f"{timeline} iteration":
                by_process.setdefault(s.process, []).append((index, s))
        if by_process:
            cycles = sorted(max(by_process.values(), key=len), key=lambda c: c[1].start_ns)
            break
    n = len(cycles)
    if n < MIN_REGIME_CYCLES:
        return []
    timeline = cycles[0][1].category
    ms = [s.duration_ns / 1e6 for _, s in cycles]
    first = 0
    rest = sorted(ms[START_UP_MAX_CYCLES:])
    typical = nearest_rank(rest, 0.5)
    while first < START_UP_MAX_CYCLES and ms[first] > max(START_UP_FACTOR * typical, STALL_MIN_MS):
        first += 1
    position = {index: k for k, (index, _) in enumerate(cycles)}
    names: list[set[str]] = [set() for _ in cycles]
    waits = [0] * n
    for s in slices:
        k = position.get(s.parent) if s.category == timeline else None
        if k is not None:
            name = phase_name(timeline, s.name)
            names[k].add(name)
            if name == _WAITS[timeline]:
                waits[k] += s.duration_ns
    warm = first
    for name in set().union(*names[first:]) - {_WAITS[timeline]}:
        begins = next(k for k in range(first, n) if name in names[k])
        later = n - begins
        if begins - first >= 2 and later >= MIN_REGIME_CYCLES and sum(name in names[k] for k in range(begins, n)) >= WARM_UP_PRESENT * later:
            warm = max(warm, begins)
    bounds = [(START_UP, 0, first), (WARM_UP, first, warm)]
    steady = ms[warm:]
    cut = _change(steady)
    if cut is None:
        cut = _shift([w / max(c.duration_ns, 1) for w, (_, c) in zip(waits[warm:], cycles[warm:], strict=True)])
    if cut is None:
        bounds.append((STEADY, warm, n))
    else:
        bounds += [(STEADY, warm, warm + cut), (CHANGED, warm + cut, n)]
    bounds = [b for b in bounds if b[2] > b[1]]
    if len(bounds) < 2:
        return []
    parts = []
    for number, (kind, lo, hi) in enumerate(bounds):
        start_ns = cycles[lo][1].start_ns
        end_ns = cycles[hi - 1][1].end_ns
        parts.append(_Part(
            kind, lo, hi - 1, start_ns, -(2**63) if number == 0 else start_ns, 2**63 if number == len(bounds) - 1 else cycles[hi][1].start_ns,
            (end_ns - start_ns) / 1e9, nearest_rank(sorted(ms[lo:hi]), 0.5),
        ))  # fmt: skip
    return parts


def _best_split(values: list[float], gap: Callable[[float, float], float]) -> int | None:
    """The split of ``values`` whose two sides' means are furthest apart by ``gap``, each side :data:`MIN_REGIME_CYCLES` long."""
    n = len(values)
    if n < 2 * MIN_REGIME_CYCLES:
        return None
    prefix = [0.0]
    for x in values:
        prefix.append(prefix[-1] + x)
    best, cut = 0.0, None
    for k in range(MIN_REGIME_CYCLES, n - MIN_REGIME_CYCLES + 1):
        if (apart := gap(prefix[k] / k, (prefix[n] - prefix[k]) / (n - k))) > best:
            best, cut = apart, k
    return cut


def _shift(shares: list[float]) -> int | None:
    """Where a steady state's wait (its share of each cycle) moves, when the two sides' medians differ by :data:`SHIFT_SHARE`."""
    cut = _best_split(shares, lambda left, right: abs(left - right))
    if cut is None:
        return None
    left, right = nearest_rank(sorted(shares[:cut]), 0.5), nearest_rank(sorted(shares[cut:]), 0.5)
    return cut if abs(left - right) >= SHIFT_SHARE else None


def _change(ms: list[float]) -> int | None:
    """Where a steady state's cycles change pace (the split that most separates the two sides' means, each side
    :data:`MIN_REGIME_CYCLES` long at least), when their medians differ by :data:`CHANGE_RATIO`; else None."""
    cut = _best_split(ms, lambda left, right: abs(math.log(left / right)) if left > 0 and right > 0 else 0.0)
    if cut is None:
        return None
    low, high = sorted((nearest_rank(sorted(ms[:cut]), 0.5), nearest_rank(sorted(ms[cut:]), 0.5)))
    return cut if low > 0 and high / low >= CHANGE_RATIO else None


def measure(model: TraceModel, window: tuple[int, int] | None = None) -> Report:
    """Where the time goes in a trace (``window``: only what starts in ``[lo, hi)`` ns), without a diagnosis."""
    slices = model.slices
    lo, hi = window if window is not None else (-(2**63), 2**63)
    iterations: dict[str, list[Slice]] = {}
    phases: dict[str, list[Slice]] = {}
    for s in slices:
        if s.category not in schema.TIMELINES or not lo <= s.start_ns < hi:
            continue
        if s.name == f"{s.category} iteration":
            iterations.setdefault(s.category, []).append(s)
        elif not _inside_itself(slices, s):
            phases.setdefault(s.category, []).append(s)

    def is_top(s: Slice) -> bool:
        parent = s.parent
        while parent != -1 and slices[parent].category not in schema.TIMELINES:
            parent = slices[parent].parent  # a profiler's slice around the phase (torch.profiler's record_function)
        return parent == -1 or slices[parent].name == f"{slices[parent].category} iteration"

    everything = [s for s in slices if s.category in schema.TIMELINES and lo <= s.start_ns < hi]
    span_start = min((s.start_ns for s in everything), default=0)
    span_end = max((s.end_ns for s in everything), default=0)
    span = max(span_end - span_start, 1)

    timelines: dict[str, Timeline] = {}
    busy: dict[str, list[tuple[int, int]]] = {}
    for timeline in schema.TIMELINES:
        own = phases.get(timeline, [])
        cycles = iterations.get(timeline, [])
        if not own and not cycles:
            continue
        entry, top = _timeline_entry(timeline, cycles, own, is_top)
        per_rank = ranks.rank_tables(cycles, own, lambda c, p, t=timeline: _timeline_entry(t, c, p, is_top)[0])
        timelines[timeline] = dataclasses.replace(entry, ranks=per_rank) if per_rank else entry
        busy[timeline] = _union([(s.start_ns, s.end_ns) for s in top if phase_name(timeline, s.name) != _WAITS[timeline]])

    gpu: dict[str, float] = {}
    for s in slices:
        if s.category == "gpu" and lo <= s.start_ns < hi:
            gpu.setdefault(s.track, 0)
    for track in gpu:
        intervals = _union([(s.start_ns, s.end_ns) for s in slices if s.category == "gpu" and s.track == track and lo <= s.start_ns < hi])
        gpu[track] = _total(intervals) / span

    job_steps, rank_steps = _throughput(iterations)
    return Report(
        wall_s=span / 1e9 if everything else 0.0,
        turns=_turns(iterations, phases, span),
        env_steps_per_s=job_steps,
        env_steps_per_s_by_rank={str(rank): v for rank, v in sorted(rank_steps.items())} if len(rank_steps) > 1 else None,
        timelines=timelines,
        overlap_share=(
            _intersection(busy[schema.LEARNER], busy[schema.COLLECTOR]) / span
            if schema.LEARNER in busy and schema.COLLECTOR in busy
            else None
        ),
        gpu_busy_share=gpu,
        host=host.readings(model.system),
        profile=operators_by_phase(slices) or None,
        straggler=next((found for name, entry in timelines.items() if (found := rules.straggler(entry.ranks, name)) is not None), None),
    )


SEQUENTIAL_OVERLAP = 0.05
"""Learner and collector cycles overlapping for less than this share of the shorter side's time: they take turns."""


def _turns(iterations: dict[str, list[Slice]], phases: dict[str, list[Slice]], span: int) -> Turns | None:
    """For a loop that collects and learns in turn: each side's share of wall time.

    A side works in its cycles, except while it waits for the other side
    (the learner's Collector Wait, the collector's Learner Action Wait): one
    thread (most single-process libraries) or a driver that waits for its
    env runners (RLlib) takes turns. ``collector`` and ``learner``: the share
    of wall time each side works; ``outside``: neither. None when the two
    sides work at once (or one is missing): then each side's own cycle is
    what to read.
    """

    def working(timeline: str) -> list[tuple[int, int]]:
        cycles = _union([(s.start_ns, s.end_ns) for s in iterations.get(timeline, [])])
        waits = _union([(s.start_ns, s.end_ns) for s in phases.get(timeline, []) if phase_name(timeline, s.name) == _WAITS[timeline]])
        return _subtract(cycles, waits)

    learner, collector = working(schema.LEARNER), working(schema.COLLECTOR)
    if not learner or not collector:
        return None
    if _intersection(learner, collector) > SEQUENTIAL_OVERLAP * min(_total(learner), _total(collector)):
        return None
    shares = (_total(collector) / span, _total(learner) / span)
    return Turns(collector=shares[0], learner=shares[1], outside=max(0.0, 1.0 - sum(shares)))


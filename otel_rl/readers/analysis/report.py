"""Where the time goes: per-phase statistics, overlap, GPU busy share, and the bottleneck diagnosis.

Computed from a :class:`TraceModel`, whichever engine read it. The diagnosis
applies the bottleneck-reading table of the learner/collector design:

* learner Collector Wait high: the collector is the bottleneck (env step,
  transition post-processing, IPC);
* collector Learner Action Wait high while learner Collector Wait is low: the
  learner is (Learning, updates per step, batch size, then inference);
* learner Inference high: look at its H2D, forward and D2H parts;
* learner Replay Batch Wait high: device prefetch falls behind;
* collector Replay Write high: the replay ingress is saturated;
* a high background submit time with healthy main phases is not a bottleneck;
* a loop that collects and learns in turn (the collector works only while
  the learner waits for it, and the other way round: one thread, as in most
  single-process libraries, or a driver that waits for its env runners, as
  RLlib's) is judged by where the wall time goes: the side with the larger
  share, through its largest phase;
* time in no phase that outweighs every phase is named as unaccounted,
  never attributed to a phase;
* a rare occurrence far above its phase's median (over :data:`STALL_FACTOR`
  times it and :data:`STALL_MIN_MS`, at most :data:`STALL_MAX_FRACTION` of the
  occurrences) is a stall: counted and shown as such, never averaged into its
  phase, so one host stall cannot name a bottleneck.

Every finding carries the numbers behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from otel_rl.formats import schema
from otel_rl.readers.analysis import host, ranks
from otel_rl.readers.analysis.operators import operators_by_phase, render_operators
from otel_rl.readers.analysis.trace_model import Slice, TraceModel

HIGH_WAIT = 0.25
"""A wait phase above this share of its cycle means the other side holds it up."""
HIGH_INFERENCE = 0.25
HIGH_REPLAY_BATCH_WAIT = 0.15
HIGH_REPLAY_WRITE = 0.30
HIGH_OTHER = 0.20
HIGH_STALLS = 0.05
"""Stalls holding more than this share of a timeline's time are a finding of their own."""
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


def _cycle_stats(durations_ns: list[int]) -> dict[str, Any]:
    """A timeline's cycle statistics, with up to :data:`MAX_SAMPLES` of its durations (in order, evenly spaced)."""
    ms = [d / 1e6 for d in durations_ns]
    stride = max(1, math.ceil(len(ms) / MAX_SAMPLES))
    return {**_stats(sorted(ms)), "samples": [round(x, 4) for x in ms[::stride]]}


def _phase_stats(durations_ns: list[int]) -> dict[str, Any]:
    """A phase's statistics without its stalls, and the stalls' count and time."""
    ms = sorted(d / 1e6 for d in durations_ns)
    threshold = max(STALL_FACTOR * nearest_rank(ms, 0.5), STALL_MIN_MS)
    stalls = [x for x in ms if x > threshold]
    if len(stalls) > max(1, STALL_MAX_FRACTION * len(ms)):
        stalls = []  # long occurrences this common are how the phase runs
    steady = ms[: len(ms) - len(stalls)]
    return {**_stats(steady), "stalls": len(stalls), "stall_ms": sum(stalls), "stall_max_ms": max(stalls, default=0.0)}


def _throughput(iterations: dict[str, list[Slice]]) -> tuple[float | None, dict[int, float]]:
    """Env steps per second of the job and of each rank (:func:`ranks.throughput`), the learner's, else the collector's."""
    for timeline in (schema.LEARNER, schema.COLLECTOR):
        job, per_rank = ranks.throughput(iterations.get(timeline, []))
        if job is not None:
            return job, per_rank
    return None, {}


def _timeline_entry(timeline: str, cycles: list[Slice], own: list[Slice], is_top: Callable[[Slice], bool]) -> tuple[dict[str, Any], list[Slice]]:
    """A timeline's table (cycles, phases, accounted and other shares) from its cycles and phases, and its top-level phases."""
    # Top-level phases inside cycles (or all of them for a timeline without cycles).
    top = [s for s in own if is_top(s) and (s.parent != -1 or not cycles)]
    wall = sum(c.duration_ns for c in cycles) if cycles else sum(s.duration_ns for s in top)
    entry: dict[str, Any] = {"cycles": len(cycles), "cycle_ms": _cycle_stats([c.duration_ns for c in cycles]) if cycles else None}
    by_name: dict[str, list[Slice]] = {}
    for s in own:
        by_name.setdefault(phase_name(timeline, s.name), []).append(s)
    table = {}
    for name, occurrences in by_name.items():
        stat = _phase_stats([s.duration_ns for s in occurrences])
        stat["title"] = occurrences[0].name
        stat["nested"] = not any(is_top(s) for s in occurrences)
        # Work on other threads, never inside this timeline's cycles: it overlaps them.
        stat["background"] = bool(cycles) and not stat["nested"] and all(s.parent == -1 for s in occurrences)
        stat["share"] = stat["total_ms"] * 1e6 / wall if wall else 0.0
        table[name] = stat
    accounted = sum(s.duration_ns for s in top)
    stalled = sum(stat["stall_ms"] for stat in table.values() if not stat["nested"] and not stat["background"]) * 1e6
    entry["phases"] = dict(sorted(table.items(), key=lambda kv: (kv[1]["nested"], -kv[1]["total_ms"])))
    entry["accounted_share"] = (accounted - stalled) / wall if wall else 0.0
    entry["stall_share"] = stalled / wall if wall else 0.0
    entry["other_share"] = max(wall - accounted, 0) / wall if wall and cycles else 0.0
    return entry, top


def analyze_model(model: TraceModel) -> dict[str, Any]:
    """The analysis report as a JSON-ready dict (see :func:`render_text`)."""
    slices = model.slices
    iterations: dict[str, list[Slice]] = {}
    phases: dict[str, list[Slice]] = {}
    for s in slices:
        if s.category not in schema.TIMELINES:
            continue
        if s.name == f"{s.category} iteration":
            iterations.setdefault(s.category, []).append(s)
        else:
            phases.setdefault(s.category, []).append(s)

    def is_top(s: Slice) -> bool:
        parent = s.parent
        while parent != -1 and slices[parent].category not in schema.TIMELINES:
            parent = slices[parent].parent  # a profiler's slice around the phase (torch.profiler's record_function)
        return parent == -1 or slices[parent].name == f"{slices[parent].category} iteration"

    everything = [s for s in slices if s.category in schema.TIMELINES]
    span_start = min((s.start_ns for s in everything), default=0)
    span_end = max((s.end_ns for s in everything), default=0)
    span = max(span_end - span_start, 1)

    timelines: dict[str, Any] = {}
    busy: dict[str, list[tuple[int, int]]] = {}
    for timeline in schema.TIMELINES:
        own = phases.get(timeline, [])
        cycles = iterations.get(timeline, [])
        if not own and not cycles:
            continue
        entry, top = _timeline_entry(timeline, cycles, own, is_top)
        per_rank = ranks.rank_tables(cycles, own, lambda c, p, t=timeline: _timeline_entry(t, c, p, is_top)[0])
        if per_rank:
            entry["ranks"] = per_rank
        timelines[timeline] = entry
        busy[timeline] = _union([(s.start_ns, s.end_ns) for s in top if phase_name(timeline, s.name) != _WAITS[timeline]])

    gpu: dict[str, float] = {}
    for s in slices:
        if s.category == "gpu":
            gpu.setdefault(s.track, 0)
    for track in gpu:
        intervals = _union([(s.start_ns, s.end_ns) for s in slices if s.category == "gpu" and s.track == track])
        gpu[track] = _total(intervals) / span

    job_steps, rank_steps = _throughput(iterations)
    report: dict[str, Any] = {
        "wall_s": span / 1e9 if everything else 0.0,
        "turns": _turns(iterations, phases, span),
        "env_steps_per_s": job_steps,
        "env_steps_per_s_by_rank": {str(rank): v for rank, v in sorted(rank_steps.items())} if len(rank_steps) > 1 else None,
        "timelines": timelines,
        "overlap_share": (
            _intersection(busy[schema.LEARNER], busy[schema.COLLECTOR]) / span
            if schema.LEARNER in busy and schema.COLLECTOR in busy
            else None
        ),
        "gpu_busy_share": gpu,
        "host": host.readings(model.system),
    }
    profile = operators_by_phase(slices)
    if profile:
        report["profile"] = profile
    report["straggler"] = next(({**found, "timeline": name} for name, entry in timelines.items() if (found := ranks.straggler(entry.get("ranks", []))) is not None), None)
    report["diagnosis"] = diagnose(report)
    return report


SEQUENTIAL_OVERLAP = 0.05
"""Learner and collector cycles overlapping for less than this share of the shorter side's time: they take turns."""


def _turns(iterations: dict[str, list[Slice]], phases: dict[str, list[Slice]], span: int) -> dict[str, float] | None:
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
    shares = {schema.COLLECTOR: _total(collector) / span, schema.LEARNER: _total(learner) / span}
    return {**shares, "outside": max(0.0, 1.0 - sum(shares.values()))}


def _share(report: dict[str, Any], timeline: str, name: str) -> float:
    return report["timelines"].get(timeline, {}).get("phases", {}).get(name, {}).get("share", 0.0)


def _p50(report: dict[str, Any], timeline: str, name: str) -> float:
    return report["timelines"].get(timeline, {}).get("phases", {}).get(name, {}).get("p50_ms", 0.0)


def _largest(report: dict[str, Any], timeline: str, exclude: tuple[str, ...] = (), nested: bool = False) -> str | None:
    table = report["timelines"].get(timeline, {}).get("phases", {})
    candidates = [
        (v["share"], k) for k, v in table.items() if k not in exclude and v["nested"] == nested and not v["background"]
    ]
    return max(candidates)[1] if candidates else None


def _title(report: dict[str, Any], timeline: str, name: str) -> str:
    return report["timelines"][timeline]["phases"][name]["title"]


def diagnose(report: dict[str, Any]) -> dict[str, Any]:
    """The main bottleneck in one plain line, and findings with their evidence."""
    bottleneck, findings = _bottleneck(report)
    found = report.get("straggler")
    if found is not None:  # the job goes at its slowest rank's pace: that is the headline
        ratio = f"{found['ratio']:.1f}x the median rank" if found["ratio"] else "only this rank has it"
        bottleneck = f"{found.get('timeline', schema.LEARNER)} rank {found['rank']} ({found['title'].lower()}, {ratio}): the straggler"
        findings.insert(0, {
            "finding": f"rank {found['rank']} is the straggler",
            "evidence": found["verdict"],
            "check": f"what rank {found['rank']} does differently in {found['title']}: its data, its device, its host's load",
        })  # fmt: skip
    findings += _stall_findings(report)
    findings += _hot_spots(report)
    for timeline in (schema.LEARNER, schema.COLLECTOR):  # every timeline by the same rule
        other = report["timelines"].get(timeline, {}).get("other_share", 0.0)
        if other >= HIGH_OTHER and not any(f["finding"].startswith(f"much of the {timeline}'s") for f in findings):
            findings.append(_unaccounted_finding(report, timeline))
    return {"bottleneck": bottleneck, "findings": findings}


def _pace_setter(report: dict[str, Any], timeline: str) -> tuple[str | None, str | None]:
    """What holds ``timeline``'s cycle: (its largest phase, or None when time in no phase outweighs it; the words for it)."""
    if _unaccounted_leads(report, timeline):
        return None, f"unaccounted: {_pct(report['timelines'][timeline]['other_share'])} of its cycle is in no phase"
    culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
    return culprit, (_title(report, timeline, culprit).lower() if culprit else None)


def _bottleneck(report: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """Which side sets the pace, and the finding that says why."""
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[dict[str, str]] = []
    bottleneck = "none found (no phases in the trace)"
    have_l, have_c = L in report["timelines"], C in report["timelines"]
    collector_wait = _share(report, L, "collector_wait")
    action_wait = _share(report, C, "learner_action_wait")

    turns = report.get("turns")
    if turns is not None:
        bottleneck, finding = _in_turns(report, turns)
        findings.append(finding)
    elif have_l and collector_wait >= HIGH_WAIT:
        culprit, where = _pace_setter(report, C) if have_c else (None, None)
        bottleneck = f"collector ({where or 'not instrumented'})"
        evidence = f"learner Collector Wait is {_pct(collector_wait)} of Iter Wall (p50 {_p50(report, L, 'collector_wait'):.2f} ms)"
        if culprit:
            evidence += f"; collector {_title(report, C, culprit)} is {_pct(_share(report, C, culprit))} of its cycle"
        elif where:
            evidence += f"; the collector's cycle is {_pct(report['timelines'][C]['other_share'])} in no phase"
        findings.append(
            {
                "finding": "the learner waits for the collector",
                "evidence": evidence,
                "check": _check(C, culprit) if culprit else "env step cost, transition post-processing, collector liveness and IPC" if not where
                else "time the collector's remaining work as phases (env-runner bookkeeping, connectors, resets) before blaming a phase",
            }
        )  # fmt: skip
    elif have_c and action_wait >= HIGH_WAIT:
        culprit, where = _pace_setter(report, L) if have_l else (None, None)
        bottleneck = f"learner ({where or 'not instrumented'})"
        evidence = f"collector Learner Action Wait is {_pct(action_wait)} of its cycle while learner Collector Wait is {_pct(collector_wait)} of Iter Wall"
        if culprit:
            evidence += f"; learner {_title(report, L, culprit)} is {_pct(_share(report, L, culprit))} of Iter Wall"
        findings.append(
            {
                "finding": "the collector waits for the learner",
                "evidence": evidence,
                "check": _check(L, culprit) if culprit else "Learning cost, updates per step, batch size; then the inference sub-phases" if not where
                else "time the learner's remaining work as phases (the update's parts, bookkeeping, logging) before blaming a phase",
            }
        )  # fmt: skip
    elif have_l and _unaccounted_leads(report, L):
        bottleneck = f"learner (unaccounted: {_pct(report['timelines'][L]['other_share'])} of Iter Wall is in no phase)"
        findings.append(_unaccounted_finding(report, L))
    elif have_l:
        culprit = _largest(report, L, exclude=("collector_wait",))
        if culprit:
            bottleneck = f"learner ({_title(report, L, culprit).lower()})"
            findings.append(
                {
                    "finding": "no side waits much for the other; the learner's largest phase sets the pace",
                    "evidence": f"learner {_title(report, L, culprit)} is {_pct(_share(report, L, culprit))} of Iter Wall"
                    + (f"; collector Learner Action Wait is {_pct(action_wait)} of its cycle" if have_c else ""),
                    "check": _check(L, culprit),
                }
            )
    elif have_c:
        culprit, where = _pace_setter(report, C)
        if where:
            bottleneck = f"collector ({where})"
    return bottleneck, findings


def _hot_spots(report: dict[str, Any]) -> list[dict[str, str]]:
    """Phases past their thresholds, whichever side sets the pace."""
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[dict[str, str]] = []
    inference = _share(report, L, "inference")
    if inference >= HIGH_INFERENCE:
        parts = {n: _share(report, L, n) for n in ("inference_h2d", "inference_forward", "inference_d2h")}
        worst = max(parts, key=parts.get)
        findings.append(
            {
                "finding": "the learner-owned action path is slow",
                "evidence": f"Inference is {_pct(inference)} of Iter Wall: H2D {_pct(parts['inference_h2d'])}, "
                f"forward {_pct(parts['inference_forward'])}, D2H {_pct(parts['inference_d2h'])}",
                "check": f"{worst.removeprefix('inference_')} first",
            }
        )
    batch_wait = _share(report, L, "replay_batch_wait")
    if batch_wait >= HIGH_REPLAY_BATCH_WAIT:
        findings.append(
            {
                "finding": "device replay prefetch falls behind",
                "evidence": f"Replay Batch Wait is {_pct(batch_wait)} of Iter Wall (p50 {_p50(report, L, 'replay_batch_wait'):.2f} ms)",
                "check": "ingress commit, side-stream gather and GPU contention",
            }
        )
    replay_write = _share(report, C, "replay_write")
    if replay_write >= HIGH_REPLAY_WRITE:
        findings.append(
            {
                "finding": "the replay ingress is saturated",
                "evidence": f"collector Replay Write is {_pct(replay_write)} of its cycle (p50 {_p50(report, C, 'replay_write'):.2f} ms)",
                "check": "free ingress slots, device commit lag",
            }
        )
    for timeline, entry in report["timelines"].items():
        for name, stat in entry["phases"].items():
            if stat["background"] and stat["share"] >= HIGH_WAIT:
                findings.append(
                    {
                        "finding": f"background {stat['title']} time is high but is not a bottleneck",
                        "evidence": f"{stat['title']} runs beside the {timeline} cycle and adds up to "
                        f"{_pct(stat['share'])} of it; it overlaps the main phases instead of adding to them",
                        "check": "the GPU copy and overlap in the Perfetto timeline, not the iteration share",
                    }
                )
    return findings


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _unaccounted_leads(report: dict[str, Any], timeline: str) -> bool:
    """More of the timeline's cycle is in no phase than in its largest phase (and enough to matter)."""
    entry = report["timelines"].get(timeline, {})
    other = entry.get("other_share", 0.0)
    culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
    return other >= HIGH_OTHER and (culprit is None or other > _share(report, timeline, culprit))


def _unaccounted_finding(report: dict[str, Any], timeline: str) -> dict[str, str]:
    word, whose = ("Iter Wall", "Iter Wall") if timeline == schema.LEARNER else ("cycle", "its cycle")
    return {
        "finding": f"much of the {timeline}'s {word} is in no phase",
        "evidence": f"Other is {_pct(report['timelines'][timeline]['other_share'])} of {whose}",
        "check": "time the loop's remaining work as phases (the update's parts, bookkeeping, logging) before blaming a phase",
    }


def _in_turns(report: dict[str, Any], turns: dict[str, float]) -> tuple[str, dict[str, str]]:
    """The verdict for a loop that collects and learns in turn: from where the wall time goes."""
    L, C = schema.LEARNER, schema.COLLECTOR
    evidence = (
        f"collection is {_pct(turns[C])} of wall time, learning {_pct(turns[L])}, "
        f"{_pct(turns['outside'])} is in neither"
    )
    if turns["outside"] >= max(turns[C], turns[L]):
        return (
            f"unaccounted ({_pct(turns['outside'])} of wall time is in no iteration)",
            {
                "finding": "collection and learning take turns, and most of the time is in neither",
                "evidence": evidence,
                "check": "what runs between rollouts and updates (evaluation, checkpoints, logging, resets): time it as phases",
            },
        )
    # Each side's wall time less its stalls: one long stall is not the side's steady cost (the stalls have a finding of their own).
    steady = {k: turns[k] * (1.0 - report["timelines"].get(k, {}).get("stall_share", 0.0)) for k in (C, L)}
    side = C if steady[C] >= steady[L] else L
    culprit = _largest(report, side, exclude=tuple(_WAITS.values()))
    if _unaccounted_leads(report, side) or culprit is None:
        where = f"unaccounted: {_pct(report['timelines'][side]['other_share'])} of its cycle is in no phase"
        check = f"time the {side}'s remaining work as phases before blaming a phase"
    else:
        where = f"{_title(report, side, culprit).lower()}, {_pct(_share(report, side, culprit))} of its cycle"
        check = _check(side, culprit)
    name = "collection" if side == C else "learning"
    return (
        f"{side} ({where})",
        {"finding": f"collection and learning take turns, and {name} takes most of the wall time", "evidence": evidence, "check": check},
    )


_CHECKS = {
    (schema.COLLECTOR, "env_step"): "env step cost and the number of environments",
    (schema.COLLECTOR, "policy_inference"): "the policy's forward pass: model size, device, how many environments share a call",
    (schema.COLLECTOR, "env_to_module"): "the env-to-module connectors: their per-step observation processing",
    (schema.COLLECTOR, "module_to_env"): "the module-to-env connectors: action sampling, unsquashing and clipping per step",
    (schema.COLLECTOR, "replay_write"): "free ingress slots, device commit lag",
    (schema.LEARNER, "learning"): "the update's cost: epochs, updates per step, batch size, model size",
    (schema.LEARNER, "replay_sample"): "the replay's sampling cost and the batch size",
    (schema.LEARNER, "gradient_sync"): "the slowest rank and the interconnect",
}


def _check(timeline: str, name: str) -> str:
    """What to look at when ``name`` sets ``timeline``'s pace."""
    return _CHECKS.get((timeline, name), f"the cost of {name.replace('_', ' ')}")


def _stall_findings(report: dict[str, Any]) -> list[dict[str, str]]:
    """Timelines whose stalls hold more than :data:`HIGH_STALLS` of their time: named as stalls, not as the phases' cost."""
    findings = []
    for timeline, entry in report["timelines"].items():
        if entry.get("stall_share", 0.0) < HIGH_STALLS:
            continue
        stalled = [stat for stat in entry["phases"].values() if stat["stalls"] and not stat["nested"]]
        parts = "; ".join(
            f"{stat['title']}: {stat['stalls']} {'stall' if stat['stalls'] == 1 else 'stalls'} of up to {stat['stall_max_ms']:,.0f} ms (median {stat['p50_ms']:,.3f} ms)"
            for stat in stalled
        )
        findings.append({
            "finding": f"stalls hold {_pct(entry['stall_share'])} of the {timeline}'s time",
            "evidence": f"{parts}; they are left out of their phases' statistics",
            "check": "what the host did at those moments (other processes, swapping, I/O, garbage collection): a stall is not the phase's steady cost",
        })  # fmt: skip
    return findings


def render_text(report: dict[str, Any]) -> str:
    """A plain report that leads with the bottleneck line."""
    lines = [f"bottleneck: {report['diagnosis']['bottleneck']}"]
    if report.get("straggler") is not None:
        lines.append(f"straggler: {report['straggler']['verdict']}")
    lines.append("")
    for finding in report["diagnosis"]["findings"]:
        lines.append(f"- {finding['finding']}: {finding['evidence']}. Check: {finding['check']}.")
    if report["diagnosis"]["findings"]:
        lines.append("")
    for timeline, entry in report["timelines"].items():
        cycle = entry["cycle_ms"]
        header = f"{timeline}: {entry['cycles']} cycles"
        if cycle:
            header += f", mean {cycle['mean_ms']:.3f} ms, p50 {cycle['p50_ms']:.3f} ms"
        lines.append(header)
        lines += _phase_table(entry)
        lines.append("")
        lines += _render_ranks(timeline, entry.get("ranks", []), report.get("straggler"))
    turns = report.get("turns")
    if turns is not None:
        lines.append(
            f"collection and learning take turns: collector {100 * turns['collector']:.1f}%, "
            f"learner {100 * turns['learner']:.1f}%, neither {100 * turns['outside']:.1f}% of wall time"
        )
    elif report["overlap_share"] is not None:
        lines.append(f"learner and collector both busy: {100 * report['overlap_share']:.1f}% of wall time")
    for track, share in report["gpu_busy_share"].items():
        lines.append(f"{track} busy: {100 * share:.1f}% of wall time")
    if (line := host.render(report.get("host", {}))) is not None:
        lines.append(line)
    lines += render_operators(report.get("profile", {}))
    if report.get("env_steps_per_s") is not None:
        by_rank = report.get("env_steps_per_s_by_rank") or {}
        each = f" (per rank: {', '.join(f'{rank}: {v:,.0f}' for rank, v in by_rank.items())})" if by_rank else ""
        lines.append(f"throughput: {report['env_steps_per_s']:,.0f} env steps/s{each}")
    lines.append(f"wall time analysed: {report['wall_s']:.2f} s")
    return "\n".join(lines)


def _phase_table(entry: dict[str, Any]) -> list[str]:
    """A timeline's phases: count, mean, median, trimmed mean, p95, share, stalls; then accounted, stalls and Other."""
    blank = ("",) * 5
    rows = [("phase", "count", "mean ms", "p50 ms", "trimmed ms", "p95 ms", "share", "stalls")]
    for stat in entry["phases"].values():
        label = ("  " if stat["nested"] else "") + stat["title"] + (" (background)" if stat["background"] else "")
        numbers = (stat["mean_ms"], stat["p50_ms"], stat["trimmed_mean_ms"], stat["p95_ms"])
        stalls = f"{stat['stalls']} ({stat['stall_ms']:,.0f} ms)" if stat["stalls"] else ""
        rows.append((label, f"{stat['count']:,}", *(f"{x:,.3f}" for x in numbers), f"{100 * stat['share']:.1f}%", stalls))
    if entry["cycles"]:
        rows.append(("accounted", *blank, f"{100 * entry['accounted_share']:.1f}%", ""))
        if entry["stall_share"]:
            rows.append(("stalls", *blank, f"{100 * entry['stall_share']:.1f}%", ""))
        rows.append(("Other", *blank, f"{100 * entry['other_share']:.1f}%", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _render_ranks(timeline: str, per_rank: list[dict[str, Any]], found: dict[str, Any] | None) -> list[str]:
    """Each rank's row per top-level phase of ``timeline`` (the straggler's marked); nothing for one rank."""
    if not per_rank:
        return []
    lines = [f"{timeline} by rank:", f"  {'phase':24s} {'rank':>5s} {'host':16s} {'count':>8s} {'mean ms':>10s} {'p95 ms':>10s} {'share':>7s}"]
    names = [name for name, stat in max(per_rank, key=lambda e: len(e["phases"]))["phases"].items() if not stat["nested"]]
    for name in names:
        for index, entry in enumerate(per_rank):
            stat = entry["phases"].get(name)
            if stat is None:
                continue
            label = stat["title"] if index == 0 or name not in per_rank[0]["phases"] else ""
            mark = "  <- straggler" if found is not None and found["rank"] == entry["rank"] and found["phase"] == name else ""
            lines.append(
                f"  {label[:24]:24s} {entry['rank']:5d} {(entry['host'] or '')[:16]:16s} {stat['count']:8d} "
                f"{stat['mean_ms']:10.3f} {stat['p95_ms']:10.3f} {100 * stat['share']:6.1f}%{mark}"
            )
    lines.append("")
    return lines

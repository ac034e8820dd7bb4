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
* a loop that collects and learns in turn (its collector and learner cycles
  never overlap: one thread, as in most single-process libraries) is judged
  by where the wall time goes: the side with the larger share, through its
  largest phase;
* time in no phase that outweighs every phase is named as unaccounted,
  never attributed to a phase.

Every finding carries the numbers behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from otel_rl.formats import schema
from otel_rl.readers.analysis import ranks
from otel_rl.readers.analysis.operators import operators_by_phase, render_operators
from otel_rl.readers.analysis.trace_model import Slice, TraceModel

HIGH_WAIT = 0.25
"""A wait phase above this share of its cycle means the other side holds it up."""
HIGH_INFERENCE = 0.25
HIGH_REPLAY_BATCH_WAIT = 0.15
HIGH_REPLAY_WRITE = 0.30
HIGH_OTHER = 0.20

_WAITS = {schema.LEARNER: "collector_wait", schema.COLLECTOR: "learner_action_wait"}
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


def _stats(durations_ns: list[int]) -> dict[str, float]:
    ms = sorted(d / 1e6 for d in durations_ns)
    mean = sum(ms) / len(ms)
    std = math.sqrt(sum((x - mean) ** 2 for x in ms) / (len(ms) - 1)) if len(ms) > 1 else 0.0
    return {"count": len(ms), "mean_ms": mean, "std_ms": std, "p50_ms": nearest_rank(ms, 0.5), "p95_ms": nearest_rank(ms, 0.95), "total_ms": sum(ms)}


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
    entry: dict[str, Any] = {"cycles": len(cycles), "cycle_ms": _stats([c.duration_ns for c in cycles]) if cycles else None}
    by_name: dict[str, list[Slice]] = {}
    for s in own:
        by_name.setdefault(phase_name(timeline, s.name), []).append(s)
    table = {}
    for name, occurrences in by_name.items():
        stat = _stats([s.duration_ns for s in occurrences])
        stat["title"] = occurrences[0].name
        stat["nested"] = not any(is_top(s) for s in occurrences)
        # Work on other threads, never inside this timeline's cycles: it overlaps them.
        stat["background"] = bool(cycles) and not stat["nested"] and all(s.parent == -1 for s in occurrences)
        stat["share"] = stat["total_ms"] * 1e6 / wall if wall else 0.0
        table[name] = stat
    accounted = sum(s.duration_ns for s in top)
    entry["phases"] = dict(sorted(table.items(), key=lambda kv: (kv[1]["nested"], -kv[1]["total_ms"])))
    entry["accounted_share"] = accounted / wall if wall else 0.0
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
        "turns": _turns(iterations, span),
        "env_steps_per_s": job_steps,
        "env_steps_per_s_by_rank": {str(rank): v for rank, v in sorted(rank_steps.items())} if len(rank_steps) > 1 else None,
        "timelines": timelines,
        "overlap_share": (
            _intersection(busy[schema.LEARNER], busy[schema.COLLECTOR]) / span
            if schema.LEARNER in busy and schema.COLLECTOR in busy
            else None
        ),
        "gpu_busy_share": gpu,
    }
    profile = operators_by_phase(slices)
    if profile:
        report["profile"] = profile
    report["straggler"] = next((found for entry in timelines.values() if (found := ranks.straggler(entry.get("ranks", []))) is not None), None)
    report["diagnosis"] = diagnose(report)
    return report


SEQUENTIAL_OVERLAP = 0.05
"""Learner and collector cycles overlapping for less than this share of the shorter side's time: they take turns."""


def _turns(iterations: dict[str, list[Slice]], span: int) -> dict[str, float] | None:
    """For a loop that collects and learns in turn (one thread, most single-process libraries): each side's share of wall time.

    ``collector`` and ``learner``: the share of wall time in each side's
    cycles; ``outside``: in neither. None when the two sides run at once
    (or one is missing): then each side's own cycle is what to read.
    """
    learner = _union([(s.start_ns, s.end_ns) for s in iterations.get(schema.LEARNER, [])])
    collector = _union([(s.start_ns, s.end_ns) for s in iterations.get(schema.COLLECTOR, [])])
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
    if found is not None:
        findings.insert(0, {
            "finding": f"rank {found['rank']} is the straggler",
            "evidence": found["verdict"],
            "check": f"what rank {found['rank']} does differently in {found['title']}: its data, its device, its host's load",
        })  # fmt: skip
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
                "check": "env step cost, transition post-processing, collector liveness and IPC" if culprit or not where
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
                "check": "Learning cost, updates per step, batch size; then the inference sub-phases" if culprit or not where
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
                    "check": "the cost of that phase",
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
    side = C if turns[C] >= turns[L] else L
    culprit = _largest(report, side, exclude=tuple(_WAITS.values()))
    if _unaccounted_leads(report, side) or culprit is None:
        where = f"unaccounted: {_pct(report['timelines'][side]['other_share'])} of its cycle is in no phase"
    else:
        where = f"{_title(report, side, culprit).lower()}, {_pct(_share(report, side, culprit))} of its cycle"
    name = "collection" if side == C else "learning"
    return (
        f"{side} ({where})",
        {
            "finding": f"collection and learning take turns on one thread, and {name} takes most of the wall time",
            "evidence": evidence,
            "check": "env step cost and the number of environments" if side == C else "the update's cost: epochs, batch size, model size",
        },
    )


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
        lines.append(f"  {'phase':28s} {'count':>8s} {'mean ms':>10s} {'p50 ms':>10s} {'p95 ms':>10s} {'share':>7s}")
        for name, stat in entry["phases"].items():
            label = ("  " if stat["nested"] else "") + stat["title"] + (" (background)" if stat["background"] else "")
            lines.append(
                f"  {label:28s} {stat['count']:8d} {stat['mean_ms']:10.3f} {stat['p50_ms']:10.3f} "
                f"{stat['p95_ms']:10.3f} {100 * stat['share']:6.1f}%"
            )
        if entry["cycles"]:
            lines.append(f"  {'accounted':28s} {'':8s} {'':10s} {'':10s} {'':10s} {100 * entry['accounted_share']:6.1f}%")
            lines.append(f"  {'Other':28s} {'':8s} {'':10s} {'':10s} {'':10s} {100 * entry['other_share']:6.1f}%")
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
    lines += render_operators(report.get("profile", {}))
    if report.get("env_steps_per_s") is not None:
        by_rank = report.get("env_steps_per_s_by_rank") or {}
        each = f" (per rank: {', '.join(f'{rank}: {v:,.0f}' for rank, v in by_rank.items())})" if by_rank else ""
        lines.append(f"throughput: {report['env_steps_per_s']:,.0f} env steps/s{each}")
    lines.append(f"wall time analysed: {report['wall_s']:.2f} s")
    return "\n".join(lines)


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

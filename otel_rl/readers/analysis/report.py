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
* a high background submit time with healthy main phases is not a bottleneck.

Every finding carries the numbers behind it.
"""

from __future__ import annotations

from statistics import quantiles
from typing import Any

from otel_rl import schema
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


def _stats(durations_ns: list[int]) -> dict[str, float]:
    ms = [d / 1e6 for d in durations_ns]
    if len(ms) >= 2:
        cuts = quantiles(ms, n=100, method="inclusive")
        p50, p95 = cuts[49], cuts[94]
    else:
        p50 = p95 = ms[0]
    return {"count": len(ms), "mean_ms": sum(ms) / len(ms), "p50_ms": p50, "p95_ms": p95, "total_ms": sum(ms)}


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
        return s.parent == -1 or slices[s.parent].name == f"{slices[s.parent].category} iteration"

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
        timelines[timeline] = entry
        busy[timeline] = _union([(s.start_ns, s.end_ns) for s in top if phase_name(timeline, s.name) != _WAITS[timeline]])

    gpu: dict[str, float] = {}
    for s in slices:
        if s.category == "gpu":
            gpu.setdefault(s.track, 0)
    for track in gpu:
        intervals = _union([(s.start_ns, s.end_ns) for s in slices if s.category == "gpu" and s.track == track])
        gpu[track] = _total(intervals) / span

    report: dict[str, Any] = {
        "wall_s": span / 1e9 if everything else 0.0,
        "timelines": timelines,
        "overlap_share": (
            _intersection(busy[schema.LEARNER], busy[schema.COLLECTOR]) / span
            if schema.LEARNER in busy and schema.COLLECTOR in busy
            else None
        ),
        "gpu_busy_share": gpu,
    }
    report["diagnosis"] = diagnose(report)
    return report


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
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[dict[str, str]] = []
    bottleneck = "none found (no phases in the trace)"
    have_l, have_c = L in report["timelines"], C in report["timelines"]
    collector_wait = _share(report, L, "collector_wait")
    action_wait = _share(report, C, "learner_action_wait")

    def pct(x: float) -> str:
        return f"{100 * x:.0f}%"

    if have_l and collector_wait >= HIGH_WAIT:
        culprit = _largest(report, C, exclude=("learner_action_wait",)) if have_c else None
        where = _title(report, C, culprit).lower() if culprit else "not instrumented"
        bottleneck = f"collector ({where})"
        evidence = f"learner Collector Wait is {pct(collector_wait)} of Iter Wall (p50 {_p50(report, L, 'collector_wait'):.2f} ms)"
        if culprit:
            evidence += f"; collector {_title(report, C, culprit)} is {pct(_share(report, C, culprit))} of its cycle"
        findings.append(
            {
                "finding": "the learner waits for the collector",
                "evidence": evidence,
                "check": "env step cost, transition post-processing, collector liveness and IPC",
            }
        )
    elif have_c and action_wait >= HIGH_WAIT:
        culprit = _largest(report, L, exclude=("collector_wait",)) or "learning"
        bottleneck = f"learner ({_title(report, L, culprit).lower()})"
        findings.append(
            {
                "finding": "the collector waits for the learner",
                "evidence": f"collector Learner Action Wait is {pct(action_wait)} of its cycle while learner "
                f"Collector Wait is {pct(collector_wait)} of Iter Wall; learner {_title(report, L, culprit)} is "
                f"{pct(_share(report, L, culprit))} of Iter Wall",
                "check": "Learning cost, updates per step, batch size; then the inference sub-phases",
            }
        )
    elif have_l:
        culprit = _largest(report, L, exclude=("collector_wait",))
        if culprit:
            bottleneck = f"learner ({_title(report, L, culprit).lower()})"
            findings.append(
                {
                    "finding": "no side waits much for the other; the learner's largest phase sets the pace",
                    "evidence": f"learner {_title(report, L, culprit)} is {pct(_share(report, L, culprit))} of Iter Wall"
                    + (f"; collector Learner Action Wait is {pct(action_wait)} of its cycle" if have_c else ""),
                    "check": "the cost of that phase",
                }
            )
    elif have_c:
        culprit = _largest(report, C, exclude=("learner_action_wait",))
        if culprit:
            bottleneck = f"collector ({_title(report, C, culprit).lower()})"

    inference = _share(report, L, "inference")
    if inference >= HIGH_INFERENCE:
        parts = {n: _share(report, L, n) for n in ("inference_h2d", "inference_forward", "inference_d2h")}
        worst = max(parts, key=parts.get)
        findings.append(
            {
                "finding": "the learner-owned action path is slow",
                "evidence": f"Inference is {pct(inference)} of Iter Wall: H2D {pct(parts['inference_h2d'])}, "
                f"forward {pct(parts['inference_forward'])}, D2H {pct(parts['inference_d2h'])}",
                "check": f"{worst.removeprefix('inference_')} first",
            }
        )
    batch_wait = _share(report, L, "replay_batch_wait")
    if batch_wait >= HIGH_REPLAY_BATCH_WAIT:
        findings.append(
            {
                "finding": "device replay prefetch falls behind",
                "evidence": f"Replay Batch Wait is {pct(batch_wait)} of Iter Wall (p50 {_p50(report, L, 'replay_batch_wait'):.2f} ms)",
                "check": "ingress commit, side-stream gather and GPU contention",
            }
        )
    replay_write = _share(report, C, "replay_write")
    if replay_write >= HIGH_REPLAY_WRITE:
        findings.append(
            {
                "finding": "the replay ingress is saturated",
                "evidence": f"collector Replay Write is {pct(replay_write)} of its cycle (p50 {_p50(report, C, 'replay_write'):.2f} ms)",
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
                        f"{pct(stat['share'])} of it; it overlaps the main phases instead of adding to them",
                        "check": "the GPU copy and overlap in the Perfetto timeline, not the iteration share",
                    }
                )
    other = report["timelines"].get(L, {}).get("other_share", 0.0)
    if other >= HIGH_OTHER:
        findings.append(
            {
                "finding": "much of Iter Wall is in no phase",
                "evidence": f"Other is {pct(other)} of Iter Wall",
                "check": "instrument the loop's remaining work (metrics drain, bookkeeping)",
            }
        )
    return {"bottleneck": bottleneck, "findings": findings}


def render_text(report: dict[str, Any]) -> str:
    """A plain report that leads with the bottleneck line."""
    lines = [f"bottleneck: {report['diagnosis']['bottleneck']}", ""]
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
    if report["overlap_share"] is not None:
        lines.append(f"learner and collector both busy: {100 * report['overlap_share']:.1f}% of wall time")
    for track, share in report["gpu_busy_share"].items():
        lines.append(f"{track} busy: {100 * share:.1f}% of wall time")
    lines.append(f"wall time analysed: {report['wall_s']:.2f} s")
    return "\n".join(lines)

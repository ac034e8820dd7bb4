"""``otel-rl analyze RUN --compare BASELINE``: what changed between two runs of the same job, and how sure that is.

Both runs are analysed as ``otel-rl analyze`` does (:func:`.measure.analyze_model`),
then compared per timeline and phase: the mean (with the median and p95
beside it), the time per cycle, its weight in the wall time, the share of the
cycle, Other, and the throughput (env steps per second). A phase one run
lacks is shown on its side only.

A phase's change counts by where the wall time is: its change per cycle,
as a share of the baseline's cycle, times its timeline's weight (``wall``
in the table). In a loop that takes turns the weight is the timeline's
share of the wall time; where both sides run at once, the share of its
cycle a side does not wait for the other (the side everyone waits for
weighs 1); a trace of one timeline weighs it 1. So a side that holds 3% of
the wall time cannot explain the run.

The verdict names the phase that moved the wall time most ("Learning +38%
per iteration (+30% of wall time), no other phase moved the wall time by
more than 3%: the learner got slower"). It is only as sure as the data:
with fewer than :data:`MIN_CYCLES` cycles on a side it makes none; a cycle
changed only when its median moved by more than :data:`NOISE` and the
rank-sum test over the per-cycle samples gives p < :data:`ALPHA` (a throughput
that moved while no cycle's median did is put down to the slow cycles, or to
the env steps a cycle does, never to a phase); when the
hosts differed (other processes' CPU, steal, load, preemptions), or the
host was busy in both runs, it says so before it names a phase, and that
the runs had the same settings when they did.
"""

from __future__ import annotations

from typing import Any

from otel_rl.formats import schema
from otel_rl.readers.analysis import host
from otel_rl.formats.report import PhaseStats, Report, Stats
from otel_rl.readers.analysis.significance import rank_sum_p

_WAITS = schema.SIDE_WAITS
NOISE = 0.05
"""Relative changes up to this are within the noise of two runs on one machine."""
ALPHA = 0.01
"""A change of the cycle is significant below this p-value of the rank-sum test."""
MIN_CYCLES = 10
"""Cycles a timeline needs on both sides for a verdict: with fewer, one slow cycle is the whole difference."""


def _relative(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or not before:
        return None
    return after / before - 1.0


def _per_cycle(stat: PhaseStats | None, cycles: int) -> float | None:
    if stat is None:
        return None
    return stat.total_ms / cycles if cycles else stat.mean_ms


def _cell(after: Stats | None, before: Stats | None, key: str) -> tuple[float | None, float | None, float | None]:
    pair = (getattr(before, key) if before else None, getattr(after, key) if after else None)
    return pair[0], pair[1], _relative(pair[1], pair[0])


def _phase(after: PhaseStats | None, before: PhaseStats | None, cycles: tuple[int, int], base_cycle: float | None, weight: float) -> dict[str, Any]:
    either = after or before
    assert either is not None  # a phase of one run at least
    per_cycle = (_per_cycle(before, cycles[1]), _per_cycle(after, cycles[0]))
    moved = ((per_cycle[1] or 0.0) - (per_cycle[0] or 0.0)) / base_cycle if base_cycle else 0.0
    return {
        "title": (after.title if after else "") or (before.title if before else ""),
        "nested": either.nested,
        "background": either.background,
        "in": "both" if after and before else ("run" if after else "baseline"),
        "mean_ms": _cell(after, before, "mean_ms"),
        "p50_ms": _cell(after, before, "p50_ms"),
        "p95_ms": _cell(after, before, "p95_ms"),
        "per_cycle_ms": (*per_cycle, _relative(per_cycle[1], per_cycle[0])),
        "wall": moved * weight,
        "share": (before.share if before else None, after.share if after else None),
    }


def weight(timeline: str, run: Report, baseline: Report) -> float:
    """How much of the wall time a change of ``timeline``'s cycle moves (the larger of the two runs')."""
    weights = []
    for report in (baseline, run):
        entry = report.timelines.get(timeline)
        if len(report.timelines) < 2:
            weights.append(1.0)  # its waits are for a side the trace does not show: they absorb nothing
        elif report.turns is not None:
            weights.append(getattr(report.turns, timeline, 0.0))
        else:
            wait = entry.phases.get(_WAITS[timeline]) if entry is not None else None
            weights.append(1.0 - (wait.share if wait is not None else 0.0))
    return max(weights)


def _timeline(name: str, run: Report, baseline: Report) -> dict[str, Any]:
    after, before = run.timelines[name], baseline.timelines[name]
    cycles = (after.cycles, before.cycles)
    base_cycle = before.cycle_ms.mean_ms if before.cycle_ms else None
    share = weight(name, run, baseline)
    names = list(dict.fromkeys([*before.phases, *after.phases]))
    out: dict[str, Any] = {
        "cycles": (before.cycles, after.cycles),
        "weight": share,
        "phases": {n: _phase(after.phases.get(n), before.phases.get(n), cycles, base_cycle, share) for n in names},
        "other_share": (before.other_share, after.other_share),
    }
    if after.cycle_ms and before.cycle_ms:
        out["cycle_mean_ms"] = _cell(after.cycle_ms, before.cycle_ms, "mean_ms")
        out["cycle_p50_ms"] = _cell(after.cycle_ms, before.cycle_ms, "p50_ms")
        out["p_value"] = rank_sum_p(before.cycle_ms.samples, after.cycle_ms.samples)
        out["changed"] = abs(out["cycle_p50_ms"][2] or 0.0) > NOISE and out["p_value"] < ALPHA
        other = (before.other_share * out["cycle_mean_ms"][0], after.other_share * out["cycle_mean_ms"][1])
        out["other_wall"] = (other[1] - other[0]) / base_cycle * share if base_cycle else 0.0
    return out


def compare_reports(run: Report, baseline: Report, same_settings: bool | None = None) -> dict[str, Any]:
    """The comparison of two analysis reports as a JSON-ready dict: per timeline, per phase, throughput, hosts, verdict.

    ``same_settings``: whether the two runs had the same settings (their ``run_config.json``), when known.
    """
    timelines: dict[str, Any] = {}
    for name in dict.fromkeys([*baseline.timelines, *run.timelines]):
        if name in run.timelines and name in baseline.timelines:
            timelines[name] = _timeline(name, run, baseline)
        else:
            timelines[name] = {"in": "run" if name in run.timelines else "baseline"}
    throughput = (baseline.env_steps_per_s, run.env_steps_per_s)
    hosts = (dict(baseline.host), dict(run.host))
    out = {
        "timelines": timelines,
        "env_steps_per_s": (*throughput, _relative(throughput[1], throughput[0])),
        "host": {"baseline": hosts[0], "run": hosts[1], "differences": host.differences(*hosts), "busy_in_both": host.busy_in_both(*hosts)},
        "same_settings": same_settings,
    }
    out["verdict"] = verdict(out)
    return out


def _contributions(comparison: dict[str, Any]) -> list[tuple[float, str, str, float | None]]:
    """(a phase's change as a share of the baseline's wall time, timeline, title, its change per cycle), largest first."""
    found = []
    for timeline, entry in comparison["timelines"].items():
        if "cycle_mean_ms" not in entry:
            continue
        for name, stat in entry["phases"].items():
            if stat["nested"] or stat["background"] or name in _WAITS.values():
                continue  # a wait grows when the other side is slower: that side's phase is named instead
            found.append((stat["wall"], timeline, stat["title"], stat["per_cycle_ms"][2]))
        before_other, after_other = entry["other_share"]
        before_cycle, after_cycle, _ = entry["cycle_mean_ms"]
        found.append((entry["other_wall"], timeline, "Other", _relative(after_other * after_cycle, before_other * before_cycle)))
    return sorted(found, key=lambda c: -abs(c[0]))


def _caveat(comparison: dict[str, Any]) -> str:
    """What to know before reading a phase's change: the hosts differed, or were busy, and whether the settings were the same."""
    hosts = comparison["host"]
    same = comparison["same_settings"]
    if hosts["differences"]:
        whose = "the host's, not the job's" if same else "the host's as much as the job's"
        settings = "the same settings, but " if same else ""
        return f"{settings}the hosts differed ({'; '.join(hosts['differences'])}): the change may be {whose}. "
    if hosts["busy_in_both"]:
        settings = " with the same settings" if same else ""
        return f"a busy host ({hosts['busy_in_both']}){settings}: expect changes from the host alone. "
    return ""


def verdict(comparison: dict[str, Any]) -> str:
    """One sentence: how sure, then which phase changed the run and which side it slowed or sped up, or that nothing changed beyond noise."""
    changed = [e for e in comparison["timelines"].values() if e.get("changed")]
    throughput = comparison["env_steps_per_s"][2]
    moved_throughput = throughput is not None and abs(throughput) > NOISE
    tail = f"; throughput {throughput:+.0%}" if throughput is not None else ""
    counts = [n for e in comparison["timelines"].values() if e.get("cycle_mean_ms") for n in e["cycles"]]
    if counts and min(counts) < MIN_CYCLES:
        return f"too few cycles to tell (n={min(counts)}; a verdict needs {MIN_CYCLES} on each side): see the table{tail}"
    caveat = _caveat(comparison)
    medians = [abs(e["cycle_p50_ms"][2] or 0.0) for e in comparison["timelines"].values() if e.get("cycle_p50_ms")]
    contributions = _contributions(comparison)
    if not changed:
        within = f"every cycle's median within {max(medians, default=0.0):.0%} of the baseline"
        if contributions and abs(contributions[0][0]) > NOISE:  # a phase of some cycles only (learning after learning_starts)
            moved, timeline, title, change = contributions[0]
            return f"{caveat}{within}, but {_moved(contributions)} in the cycles that have it: the {timeline} got {'slower' if moved > 0 else 'faster'}{tail}"
        aside = _aside(contributions)
        if not moved_throughput:
            return f"{caveat}nothing changed beyond noise: {within}{aside}{tail}"
        if medians:  # the throughput moved, no cycle's median did: the slow cycles, or the steps a cycle does
            means = [abs(e["cycle_mean_ms"][2] or 0.0) for e in comparison["timelines"].values() if e.get("cycle_mean_ms")]
            if max(means, default=0.0) > NOISE:
                return f"{caveat}no phase changed ({within}{aside}), but the slow cycles did: stalls in one run (often the host), not the code{tail}"
            return f"{caveat}no phase changed ({within}{aside}): each cycle did {'more' if throughput > 0 else 'fewer'} env steps{tail}"
    if not contributions:
        return f"{caveat}the runs share no timeline to compare{tail}"
    moved, timeline, title, change = contributions[0]
    rest = max((abs(c[0]) for c in contributions[1:]), default=0.0)
    side = f"the {timeline} got {'slower' if moved > 0 else 'faster'}"
    return f"{caveat}{_moved(contributions)}, no other phase moved the wall time by more than {rest:.0%}: {side}{tail}"


def _how(contribution: tuple[float, str, str, float | None]) -> str:
    moved, timeline, title, change = contribution
    unit = "per iteration" if timeline == schema.LEARNER else "per cycle"
    how = f"{change:+.0%} {unit}" if change is not None else ("new" if moved > 0 else "gone")
    return f"{title} {how}"


def _moved(contributions: list[tuple[float, str, str, float | None]]) -> str:
    return f"{_how(contributions[0])} ({contributions[0][0]:+.0%} of wall time)"


def _aside(contributions: list[tuple[float, str, str, float | None]]) -> str:
    """Phases whose time per cycle moved beyond noise while weighing too little to move the run: named, as the table shows them."""
    moved = [c for c in contributions if c[2] != "Other" and (c[3] is None or abs(c[3]) > 2 * NOISE)][:2]
    if not moved:
        return ""
    return "; " + " and ".join(_how(c) for c in moved) + f", too little of the wall time to move it (at most {max(abs(c[0]) for c in moved):.1%})"


def render_comparison(comparison: dict[str, Any]) -> str:
    """The comparison as text, led by the verdict."""
    lines = [f"verdict: {comparison['verdict']}", ""]
    for timeline, entry in comparison["timelines"].items():
        if "phases" not in entry:
            lines += [f"{timeline}: only in the {entry['in']}", ""]
            continue
        header = f"{timeline}: cycles {entry['cycles'][0]} -> {entry['cycles'][1]}, weight {entry['weight']:.0%} of wall time"
        if "cycle_mean_ms" in entry:
            header += f", mean {_change(entry['cycle_mean_ms'])}, median {_pct(entry['cycle_p50_ms'][2])} (p={entry['p_value']:.2g})"
        rows = [("phase", "mean", "median", "p95", "per cycle", "wall", "share")]
        for stat in entry["phases"].values():
            label = ("  " if stat["nested"] else "") + (stat["title"] or "?") + ("" if stat["in"] == "both" else f" ({stat['in']} only)")
            share = " -> ".join("-" if v is None else f"{100 * v:.0f}%" for v in stat["share"])
            cells = (_change(stat["mean_ms"]), _pct(stat["p50_ms"][2]), _pct(stat["p95_ms"][2]), _pct(stat["per_cycle_ms"][2]))
            rows.append((label, *cells, "" if stat["nested"] or stat["background"] else _pct(stat["wall"]), share))
        before_other, after_other = entry["other_share"]
        rows.append(("Other", "", "", "", "", _pct(entry.get("other_wall")), f"{100 * before_other:.0f}% -> {100 * after_other:.0f}%"))
        lines += [header, *_aligned(rows), ""]
    before, after, change = comparison["env_steps_per_s"]
    if before is not None or after is not None:
        shown = " -> ".join("-" if v is None else f"{v:,.0f}" for v in (before, after))
        lines.append(f"throughput (env steps/s): {shown} ({_pct(change)})")
    for side in ("baseline", "run"):
        if (line := host.render(comparison["host"][side])) is not None:
            lines.append(f"{side} {line}")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.0f}%"


def _change(cell: tuple[float | None, float | None, float | None]) -> str:
    """``1,629.6 -> 806.4 ms (-51%)``: a mean before and after, and its change."""
    before, after, change = cell
    shown = " -> ".join("-" if v is None else f"{v:,.1f}" for v in (before, after))
    return f"{shown} ms" + ("" if change is None else f" ({_pct(change)})")


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as text columns as wide as their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]

"""``otel-rl analyze RUN --compare BASELINE``: what changed between two runs of the same job, and a verdict.

Both runs are analysed as ``otel-rl analyze`` does (:func:`report.analyze_model`),
then compared per timeline and phase: the change of the mean, the p95, the
time per cycle and the share of the cycle, of Other, and of the throughput
(env steps per second). A phase one run lacks is shown on its side only.

The verdict names the phase whose time per cycle moved the cycle most, as a
share of the baseline's cycle (waits for the other side left out: they grow
when the other side is slower) ("Learning +38% per iteration, no other phase
moved the cycle by more than 3%: the learner got slower"). A change is noise
unless it is over :data:`NOISE` of the baseline and over three standard errors
of the two means; when no cycle and no throughput changed beyond noise, it
says so; with fewer than :data:`MIN_CYCLES` cycles on a side it makes no
verdict at all.
"""

from __future__ import annotations

import math
from typing import Any

from otel_rl.formats import schema

_WAITS = frozenset({"collector_wait", "learner_action_wait"})
NOISE = 0.05
"""Relative changes up to this are within the noise of two runs on one machine."""
MIN_CYCLES = 10
"""Cycles a timeline needs on both sides for a verdict: with fewer, one slow cycle is the whole difference."""


def _relative(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or not before:
        return None
    return after / before - 1.0


def _beyond_noise(after: dict[str, float], before: dict[str, float]) -> bool:
    """Means that differ by more than :data:`NOISE` and by more than three standard errors."""
    change = _relative(after["mean_ms"], before["mean_ms"])
    if change is None or abs(change) <= NOISE:
        return False
    error = math.sqrt(after["std_ms"] ** 2 / after["count"] + before["std_ms"] ** 2 / before["count"])
    return abs(after["mean_ms"] - before["mean_ms"]) > 3 * error


def _per_cycle(stat: dict[str, Any] | None, cycles: int) -> float | None:
    if stat is None:
        return None
    return stat["total_ms"] / cycles if cycles else stat["mean_ms"]


def _phase(after: dict[str, Any] | None, before: dict[str, Any] | None, cycles: tuple[int, int]) -> dict[str, Any]:
    a, b = after or {}, before or {}
    per_cycle = (_per_cycle(after, cycles[0]), _per_cycle(before, cycles[1]))
    return {
        "title": a.get("title") or b.get("title"),
        "nested": a.get("nested", b.get("nested", False)),
        "background": a.get("background", b.get("background", False)),
        "in": "both" if after and before else ("run" if after else "baseline"),
        "mean_ms": (b.get("mean_ms"), a.get("mean_ms"), _relative(a.get("mean_ms"), b.get("mean_ms"))),
        "p95_ms": (b.get("p95_ms"), a.get("p95_ms"), _relative(a.get("p95_ms"), b.get("p95_ms"))),
        "per_cycle_ms": (per_cycle[1], per_cycle[0], _relative(per_cycle[0], per_cycle[1])),
        "share": (b.get("share"), a.get("share")),
    }


def _timeline(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    cycles = (after["cycles"], before["cycles"])
    names = list(dict.fromkeys([*before["phases"], *after["phases"]]))
    out: dict[str, Any] = {
        "cycles": (before["cycles"], after["cycles"]),
        "phases": {name: _phase(after["phases"].get(name), before["phases"].get(name), cycles) for name in names},
        "other_share": (before.get("other_share", 0.0), after.get("other_share", 0.0)),
    }
    if after["cycle_ms"] and before["cycle_ms"]:
        mean = (before["cycle_ms"]["mean_ms"], after["cycle_ms"]["mean_ms"])
        out["cycle_mean_ms"] = (*mean, _relative(mean[1], mean[0]))
        out["changed"] = _beyond_noise(after["cycle_ms"], before["cycle_ms"])
    return out


def compare_reports(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The comparison of two analysis reports as a JSON-ready dict: per timeline, per phase, throughput, verdict."""
    timelines: dict[str, Any] = {}
    for name in dict.fromkeys([*baseline["timelines"], *run["timelines"]]):
        after, before = run["timelines"].get(name), baseline["timelines"].get(name)
        timelines[name] = _timeline(after, before) if after and before else {"in": "run" if after else "baseline"}
    throughput = (baseline.get("env_steps_per_s"), run.get("env_steps_per_s"))
    out = {"timelines": timelines, "env_steps_per_s": (*throughput, _relative(throughput[1], throughput[0]))}
    out["verdict"] = verdict(out)
    return out


def _contributions(comparison: dict[str, Any]) -> list[tuple[float, str, str, float | None]]:
    """(change of a phase's time per cycle as a share of the baseline cycle, timeline, title, its own change), largest first."""
    found = []
    for timeline, entry in comparison["timelines"].items():
        if "cycle_mean_ms" not in entry:
            continue
        base_cycle = entry["cycle_mean_ms"][0]
        for name, stat in entry["phases"].items():
            if stat["nested"] or stat["background"] or name in _WAITS:
                continue  # a wait grows when the other side is slower: that side's phase is named instead
            before, after, change = stat["per_cycle_ms"]
            moved = ((after or 0.0) - (before or 0.0)) / base_cycle if base_cycle else 0.0
            found.append((moved, timeline, stat["title"], change))
        before_other, after_other = entry["other_share"]
        cycle_before, cycle_after, _ = entry["cycle_mean_ms"]
        moved = (after_other * cycle_after - before_other * cycle_before) / base_cycle if base_cycle else 0.0
        found.append((moved, timeline, "Other", _relative(after_other * cycle_after, before_other * cycle_before)))
    return sorted(found, key=lambda c: -abs(c[0]))


def verdict(comparison: dict[str, Any]) -> str:
    """One sentence: which phase changed the run and which side it slowed or sped up, or that nothing changed beyond noise."""
    changed = [t for t, e in comparison["timelines"].items() if e.get("changed")]
    throughput = comparison["env_steps_per_s"][2]
    moved_throughput = throughput is not None and abs(throughput) > NOISE
    tail = f"; throughput {throughput:+.0%}" if throughput is not None else ""
    counts = [n for e in comparison["timelines"].values() if e.get("cycle_mean_ms") for n in e["cycles"]]
    if counts and min(counts) < MIN_CYCLES:
        return f"too few cycles to tell (n={min(counts)}; a verdict needs {MIN_CYCLES} on each side): see the table{tail}"
    if not changed and not moved_throughput:
        cycles = [abs(e["cycle_mean_ms"][2]) for e in comparison["timelines"].values() if e.get("cycle_mean_ms")]
        within = max(cycles, default=0.0)
        return f"nothing changed beyond noise: every cycle within {within:.0%} of the baseline{tail}"
    contributions = _contributions(comparison)
    if not contributions:
        return f"the runs share no timeline to compare{tail}"
    moved, timeline, title, change = contributions[0]
    rest = max((abs(c[0]) for c in contributions[1:]), default=0.0)
    unit = "per iteration" if timeline == schema.LEARNER else "per cycle"
    how = f"{change:+.0%} {unit}" if change is not None else ("new" if moved > 0 else "gone")
    side = f"the {timeline} got {'slower' if moved > 0 else 'faster'}"
    return f"{title} {how}, no other phase moved the cycle by more than {rest:.0%}: {side}{tail}"


def render_comparison(comparison: dict[str, Any]) -> str:
    """The comparison as text, led by the verdict."""
    lines = [f"verdict: {comparison['verdict']}", ""]
    for timeline, entry in comparison["timelines"].items():
        if "phases" not in entry:
            lines += [f"{timeline}: only in the {entry['in']}", ""]
            continue
        header = f"{timeline}: cycles {entry['cycles'][0]} -> {entry['cycles'][1]}"
        if "cycle_mean_ms" in entry:
            header += f", mean {_change(entry['cycle_mean_ms'])}"
        rows = [("phase", "mean", "p95", "per cycle", "share")]
        for stat in entry["phases"].values():
            label = ("  " if stat["nested"] else "") + (stat["title"] or "?") + ("" if stat["in"] == "both" else f" ({stat['in']} only)")
            share = " -> ".join("-" if v is None else f"{100 * v:.0f}%" for v in stat["share"])
            rows.append((label, _change(stat["mean_ms"]), _pct(stat["p95_ms"][2]), _pct(stat["per_cycle_ms"][2]), share))
        before_other, after_other = entry["other_share"]
        rows.append(("Other", "", "", "", f"{100 * before_other:.0f}% -> {100 * after_other:.0f}%"))
        lines += [header, *_aligned(rows), ""]
    before, after, change = comparison["env_steps_per_s"]
    if before is not None or after is not None:
        shown = " -> ".join("-" if v is None else f"{v:,.0f}" for v in (before, after))
        lines.append(f"throughput (env steps/s): {shown} ({_pct(change)})")
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
    return ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]

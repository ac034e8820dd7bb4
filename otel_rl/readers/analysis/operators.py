"""What took the time of the phases a ``torch.profiler`` window profiled (``init(profile=...)``).

An operator counts for the phase it ran directly in: the first ancestor of
its slice that is a phase, through other operators. Only the outermost
operators inside a phase are summed (their children are part of them), so
the shares of a phase's operators never add up to more than its time.
"""

from __future__ import annotations

from typing import Any

from otel_rl.formats import schema, trace
from otel_rl.readers.analysis.trace_model import Slice

TOP = 5
"""Operators listed per phase."""


def operators_by_phase(slices: list[Slice]) -> dict[str, dict[str, Any]]:
    """Per profiled phase (``learner/learning``): its time while profiled and the operators that took most of it.

    Empty when the trace holds no profile window.
    """
    times: dict[tuple[str, str], dict[str, int]] = {}
    held: dict[tuple[str, str], set[int]] = {}
    for s in slices:
        if s.category != trace.OPERATOR_CATEGORY or (s.parent != -1 and slices[s.parent].category == trace.OPERATOR_CATEGORY):
            continue
        phase = s.parent
        if phase == -1 or slices[phase].category not in schema.TIMELINES or slices[phase].name.endswith(" iteration"):
            continue  # between phases
        key = (slices[phase].category, slices[phase].name)
        by_name = times.setdefault(key, {})
        by_name[s.name] = by_name.get(s.name, 0) + s.duration_ns
        held.setdefault(key, set()).add(phase)
    out: dict[str, dict[str, Any]] = {}
    for (timeline, title), by_name in sorted(times.items()):
        profiled_ns = sum(slices[i].duration_ns for i in held[(timeline, title)])
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
        share = (lambda ns: ns / profiled_ns) if profiled_ns else (lambda ns: 0.0)
        out[f"{timeline}/{title}"] = {
            "timeline": timeline,
            "title": title,
            "phases": len(held[(timeline, title)]),
            "profiled_ms": profiled_ns / 1e6,
            "operators": [{"name": name, "total_ms": ns / 1e6, "share": share(ns)} for name, ns in ranked[:TOP]],
            "outside_operators_share": max(0.0, 1.0 - share(sum(by_name.values()))),
        }
    return out


def render_operators(profile: dict[str, dict[str, Any]]) -> list[str]:
    """Text lines: per profiled phase, its largest operators by share of the phase's profiled time."""
    lines = []
    for entry in profile.values():
        operators = ", ".join(f"{op['name']} {100 * op['share']:.0f}%" for op in entry["operators"])
        lines.append(
            f"torch.profiler, {entry['timeline']} {entry['title']} ({entry['phases']} profiled, {entry['profiled_ms']:.1f} ms): "
            f"{operators}; in no operator {100 * entry['outside_operators_share']:.0f}%"
        )
    return lines

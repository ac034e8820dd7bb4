"""The analysis report as text: the bottleneck line first, then the findings, each timeline's table, and the rest."""

from __future__ import annotations

from collections.abc import Sequence

from otel_rl.readers.analysis import host
from otel_rl.readers.analysis.operators import render_operators
from otel_rl.formats.report import Report, Straggler, Timeline, RankTimeline


def render_text(report: Report) -> str:
    """A plain report that leads with the bottleneck line."""
    diagnosis = report.diagnosis
    lines = [f"bottleneck: {diagnosis.bottleneck if diagnosis else 'not diagnosed'}"]
    if report.straggler is not None:
        lines.append(f"straggler: {report.straggler.verdict}")
    if report.regimes:
        lines.append("regimes (the tables below are the one marked *):")
        for regime in report.regimes:
            span = f"iteration {regime.first_iteration}" if regime.cycles == 1 else f"iterations {regime.first_iteration}-{regime.last_iteration}"
            mark = "*" if regime.headline else " "
            verdict = "" if regime.kind == "start-up" else f": {regime.bottleneck}"
            lines.append(f" {mark} {regime.kind} at {regime.start_s:.1f} s, {regime.seconds:.1f} s, {span} (cycle p50 {regime.cycle_p50_ms:,.2f} ms){verdict}")
    lines.append("")
    findings = diagnosis.findings if diagnosis else ()
    for finding in findings:
        lines.append(f"- {finding.finding}: {finding.evidence}. Check: {finding.check}.")
    if findings:
        lines.append("")
    for timeline, entry in report.timelines.items():
        cycle = entry.cycle_ms
        header = f"{timeline}: {entry.cycles} cycles"
        if cycle:
            header += f", mean {cycle.mean_ms:.3f} ms, p50 {cycle.p50_ms:.3f} ms"
        lines.append(header)
        lines += _phase_table(entry)
        lines.append("")
        lines += _render_ranks(timeline, entry.ranks, report.straggler)
    turns = report.turns
    if turns is not None:
        lines.append(
            f"collection and learning take turns: collector {100 * turns.collector:.1f}%, "
            f"learner {100 * turns.learner:.1f}%, neither {100 * turns.outside:.1f}% of wall time"
        )
    elif report.overlap_share is not None:
        lines.append(f"learner and collector both busy: {100 * report.overlap_share:.1f}% of wall time")
    for track, share in report.gpu_busy_share.items():
        lines.append(f"{track} busy: {100 * share:.1f}% of wall time")
    if (line := host.render(dict(report.host))) is not None:
        lines.append(line)
    lines += render_operators(dict(report.profile or {}))
    if report.env_steps_per_s is not None:
        by_rank = report.env_steps_per_s_by_rank or {}
        each = f" (per rank: {', '.join(f'{rank}: {v:,.0f}' for rank, v in by_rank.items())})" if by_rank else ""
        lines.append(f"throughput: {report.env_steps_per_s:,.0f} env steps/s{each}")
    lines.append(f"wall time analysed: {report.wall_s:.2f} s")
    return "\n".join(lines)


def _phase_table(entry: Timeline) -> list[str]:
    """A timeline's phases: count, mean, median, trimmed mean, p95, share, stalls; then accounted, stalls and Other."""
    blank = ("",) * 5
    rows = [("phase", "count", "mean ms", "p50 ms", "trimmed ms", "p95 ms", "share", "stalls")]
    for stat in entry.phases.values():
        label = ("  " if stat.nested else "") + stat.title + (" (background)" if stat.background else "")
        numbers = (stat.mean_ms, stat.p50_ms, stat.trimmed_mean_ms, stat.p95_ms)
        stalls = f"{stat.stalls} ({stat.stall_ms:,.0f} ms)" if stat.stalls else ""
        rows.append((label, f"{stat.count:,}", *(f"{x:,.3f}" for x in numbers), f"{100 * stat.share:.1f}%", stalls))
    if entry.cycles:
        rows.append(("accounted", *blank, f"{100 * entry.accounted_share:.1f}%", ""))
        if entry.stall_share:
            rows.append(("stalls", *blank, f"{100 * entry.stall_share:.1f}%", ""))
        rows.append(("Other", *blank, f"{100 * entry.other_share:.1f}%", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _render_ranks(timeline: str, per_rank: Sequence[RankTimeline], found: Straggler | None) -> list[str]:
    """Each rank's row per top-level phase of ``timeline`` (the straggler's marked); nothing for one rank."""
    if not per_rank:
        return []
    lines = [f"{timeline} by rank:", f"  {'phase':24s} {'rank':>5s} {'host':16s} {'count':>8s} {'mean ms':>10s} {'p95 ms':>10s} {'share':>7s}"]
    names = [name for name, stat in max(per_rank, key=lambda e: len(e.phases)).phases.items() if not stat.nested]
    for name in names:
        for index, entry in enumerate(per_rank):
            stat = entry.phases.get(name)
            if stat is None:
                continue
            label = stat.title if index == 0 or name not in per_rank[0].phases else ""
            mark = "  <- straggler" if found is not None and found.rank == entry.rank and found.phase == name else ""
            lines.append(
                f"  {label[:24]:24s} {entry.rank:5d} {(entry.host or '')[:16]:16s} {stat.count:8d} "
                f"{stat.mean_ms:10.3f} {stat.p95_ms:10.3f} {100 * stat.share:6.1f}%{mark}"
            )
    lines.append("")
    return lines

"""The bottleneck diagnosis: rules over a measured :class:`~otel_rl.readers.analysis.report.Report`.

The rules read the bottleneck table of the learner/collector design:

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
* stalls (measured apart, :mod:`.measure`) that hold much of a timeline's
  time are named as stalls, never as a phase's cost;
* a straggler among ranks leads: the job goes at its slowest rank's pace.

They read only the report's shares and medians, so any source of them (a
trace, or the live windows a run streams) gets the same verdict. Every
finding carries the numbers behind it.
"""

from __future__ import annotations

from otel_rl.formats import schema
from otel_rl.readers.analysis.report import Diagnosis, Finding, PhaseStats, Report, Turns

HIGH_WAIT = 0.25
"""A wait phase above this share of its cycle means the other side holds it up."""
HIGH_INFERENCE = 0.25
HIGH_REPLAY_BATCH_WAIT = 0.15
HIGH_REPLAY_WRITE = 0.30
HIGH_OTHER = 0.20
HIGH_STALLS = 0.05
"""Stalls holding more than this share of a timeline's time are a finding of their own."""
_WAITS = schema.SIDE_WAITS


def _phase(report: Report, timeline: str, name: str) -> PhaseStats | None:
    entry = report.timelines.get(timeline)
    return entry.phases.get(name) if entry is not None else None


def _share(report: Report, timeline: str, name: str) -> float:
    stat = _phase(report, timeline, name)
    return stat.share if stat is not None else 0.0


def _p50(report: Report, timeline: str, name: str) -> float:
    stat = _phase(report, timeline, name)
    return stat.p50_ms if stat is not None else 0.0


def _other(report: Report, timeline: str) -> float:
    entry = report.timelines.get(timeline)
    return entry.other_share if entry is not None else 0.0


def _stall_share(report: Report, timeline: str) -> float:
    entry = report.timelines.get(timeline)
    return entry.stall_share if entry is not None else 0.0


def _largest(report: Report, timeline: str, exclude: tuple[str, ...] = (), nested: bool = False) -> str | None:
    entry = report.timelines.get(timeline)
    table = entry.phases if entry is not None else {}
    candidates = [(v.share, k) for k, v in table.items() if k not in exclude and v.nested == nested and not v.background]
    return max(candidates)[1] if candidates else None


def _title(report: Report, timeline: str, name: str) -> str:
    return report.timelines[timeline].phases[name].title


def diagnose(report: Report) -> Diagnosis:
    """The main bottleneck in one plain line, and findings with their evidence."""
    bottleneck, findings = _bottleneck(report)
    found = report.straggler
    if found is not None:  # the job goes at its slowest rank's pace: that is the headline
        ratio = f"{found.ratio:.1f}x the median rank" if found.ratio else "only this rank has it"
        bottleneck = f"{found.timeline} rank {found.rank} ({found.title.lower()}, {ratio}): the straggler"
        findings.insert(0, Finding(
            finding=f"rank {found.rank} is the straggler",
            evidence=found.verdict,
            check=f"what rank {found.rank} does differently in {found.title}: its data, its device, its host's load",
        ))  # fmt: skip
    findings += _stall_findings(report)
    findings += _hot_spots(report)
    for timeline in (schema.LEARNER, schema.COLLECTOR):  # every timeline by the same rule
        if _other(report, timeline) >= HIGH_OTHER and not any(f.finding.startswith(f"much of the {timeline}'s") for f in findings):
            findings.append(_unaccounted_finding(report, timeline))
    return Diagnosis(bottleneck=bottleneck, findings=tuple(findings))


def _pace_setter(report: Report, timeline: str) -> tuple[str | None, str | None]:
    """What holds ``timeline``'s cycle: (its largest phase, or None when time in no phase outweighs it; the words for it)."""
    if _unaccounted_leads(report, timeline):
        return None, f"unaccounted: {_pct(_other(report, timeline))} of its cycle is in no phase"
    culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
    return culprit, (_title(report, timeline, culprit).lower() if culprit else None)


def _bottleneck(report: Report) -> tuple[str, list[Finding]]:
    """Which side sets the pace, and the finding that says why."""
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[Finding] = []
    bottleneck = "none found (no phases in the trace)"
    have_l, have_c = L in report.timelines, C in report.timelines
    collector_wait = _share(report, L, "collector_wait")
    action_wait = _share(report, C, "learner_action_wait")

    if report.turns is not None:
        bottleneck, finding = _in_turns(report, report.turns)
        findings.append(finding)
    elif have_l and collector_wait >= HIGH_WAIT:
        culprit, where = _pace_setter(report, C) if have_c else (None, None)
        bottleneck = f"collector ({where or 'not instrumented'})"
        evidence = f"learner Collector Wait is {_pct(collector_wait)} of Iter Wall (p50 {_p50(report, L, 'collector_wait'):.2f} ms)"
        if culprit:
            evidence += f"; collector {_title(report, C, culprit)} is {_pct(_share(report, C, culprit))} of its cycle"
        elif where:
            evidence += f"; the collector's cycle is {_pct(_other(report, C))} in no phase"
        findings.append(Finding(
            finding="the learner waits for the collector",
            evidence=evidence,
            check=_check(C, culprit) if culprit else "env step cost, transition post-processing, collector liveness and IPC" if not where
            else "time the collector's remaining work as phases (env-runner bookkeeping, connectors, resets) before blaming a phase",
        ))  # fmt: skip
    elif have_c and action_wait >= HIGH_WAIT:
        culprit, where = _pace_setter(report, L) if have_l else (None, None)
        bottleneck = f"learner ({where or 'not instrumented'})"
        evidence = f"collector Learner Action Wait is {_pct(action_wait)} of its cycle while learner Collector Wait is {_pct(collector_wait)} of Iter Wall"
        if culprit:
            evidence += f"; learner {_title(report, L, culprit)} is {_pct(_share(report, L, culprit))} of Iter Wall"
        findings.append(Finding(
            finding="the collector waits for the learner",
            evidence=evidence,
            check=_check(L, culprit) if culprit else "Learning cost, updates per step, batch size; then the inference sub-phases" if not where
            else "time the learner's remaining work as phases (the update's parts, bookkeeping, logging) before blaming a phase",
        ))  # fmt: skip
    elif have_l and _unaccounted_leads(report, L):
        bottleneck = f"learner (unaccounted: {_pct(_other(report, L))} of Iter Wall is in no phase)"
        findings.append(_unaccounted_finding(report, L))
    elif have_l:
        culprit = _largest(report, L, exclude=("collector_wait",))
        if culprit:
            bottleneck = f"learner ({_title(report, L, culprit).lower()})"
            findings.append(Finding(
                finding="no side waits much for the other; the learner's largest phase sets the pace",
                evidence=f"learner {_title(report, L, culprit)} is {_pct(_share(report, L, culprit))} of Iter Wall"
                + (f"; collector Learner Action Wait is {_pct(action_wait)} of its cycle" if have_c else ""),
                check=_check(L, culprit),
            ))  # fmt: skip
    elif have_c:
        culprit, where = _pace_setter(report, C)
        if where:
            bottleneck = f"collector ({where})"
    return bottleneck, findings


def _hot_spots(report: Report) -> list[Finding]:
    """Phases past their thresholds, whichever side sets the pace."""
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[Finding] = []
    inference = _share(report, L, "inference")
    if inference >= HIGH_INFERENCE:
        parts = {n: _share(report, L, n) for n in ("inference_h2d", "inference_forward", "inference_d2h")}
        worst = max(parts, key=parts.get)
        findings.append(
            Finding(finding="the learner-owned action path is slow",
                evidence=f"Inference is {_pct(inference)} of Iter Wall: H2D {_pct(parts['inference_h2d'])}, "
                f"forward {_pct(parts['inference_forward'])}, D2H {_pct(parts['inference_d2h'])}",
                check=f"{worst.removeprefix('inference_')} first",
            )
        )
    batch_wait = _share(report, L, "replay_batch_wait")
    if batch_wait >= HIGH_REPLAY_BATCH_WAIT:
        findings.append(
            Finding(finding="device replay prefetch falls behind",
                evidence=f"Replay Batch Wait is {_pct(batch_wait)} of Iter Wall (p50 {_p50(report, L, 'replay_batch_wait'):.2f} ms)",
                check="ingress commit, side-stream gather and GPU contention",
            )
        )
    replay_write = _share(report, C, "replay_write")
    if replay_write >= HIGH_REPLAY_WRITE:
        findings.append(
            Finding(finding="the replay ingress is saturated",
                evidence=f"collector Replay Write is {_pct(replay_write)} of its cycle (p50 {_p50(report, C, 'replay_write'):.2f} ms)",
                check="free ingress slots, device commit lag",
            )
        )
    for timeline, entry in report.timelines.items():
        for stat in entry.phases.values():
            if stat.background and stat.share >= HIGH_WAIT:
                findings.append(
                    Finding(finding=f"background {stat.title} time is high but is not a bottleneck",
                        evidence=f"{stat.title} runs beside the {timeline} cycle and adds up to "
                        f"{_pct(stat.share)} of it; it overlaps the main phases instead of adding to them",
                        check="the GPU copy and overlap in the Perfetto timeline, not the iteration share",
                    )
                )
    return findings


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _unaccounted_leads(report: Report, timeline: str) -> bool:
    """More of the timeline's cycle is in no phase than in its largest phase (and enough to matter)."""
    other = _other(report, timeline)
    culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
    return other >= HIGH_OTHER and (culprit is None or other > _share(report, timeline, culprit))


def _unaccounted_finding(report: Report, timeline: str) -> Finding:
    word, whose = ("Iter Wall", "Iter Wall") if timeline == schema.LEARNER else ("cycle", "its cycle")
    return Finding(finding=f"much of the {timeline}'s {word} is in no phase",
        evidence=f"Other is {_pct(_other(report, timeline))} of {whose}",
        check="time the loop's remaining work as phases (the update's parts, bookkeeping, logging) before blaming a phase",
    )


def _in_turns(report: Report, turns: Turns) -> tuple[str, Finding]:
    """The verdict for a loop that collects and learns in turn: from where the wall time goes."""
    L, C = schema.LEARNER, schema.COLLECTOR
    evidence = f"collection is {_pct(turns.collector)} of wall time, learning {_pct(turns.learner)}, {_pct(turns.outside)} is in neither"
    if turns.outside >= max(turns.collector, turns.learner):
        return (
            f"unaccounted ({_pct(turns.outside)} of wall time is in no iteration)",
            Finding(finding="collection and learning take turns, and most of the time is in neither",
                evidence=evidence,
                check="what runs between rollouts and updates (evaluation, checkpoints, logging, resets): time it as phases",
            ),
        )
    # Each side's wall time less its stalls: one long stall is not the side's steady cost (the stalls have a finding of their own).
    steady = {k: share * (1.0 - _stall_share(report, k)) for k, share in ((C, turns.collector), (L, turns.learner))}
    side = C if steady[C] >= steady[L] else L
    culprit = _largest(report, side, exclude=tuple(_WAITS.values()))
    if _unaccounted_leads(report, side) or culprit is None:
        where = f"unaccounted: {_pct(_other(report, side))} of its cycle is in no phase"
        check = f"time the {side}'s remaining work as phases before blaming a phase"
    else:
        where = f"{_title(report, side, culprit).lower()}, {_pct(_share(report, side, culprit))} of its cycle"
        check = _check(side, culprit)
    name = "collection" if side == C else "learning"
    return (
        f"{side} ({where})",
        Finding(finding=f"collection and learning take turns, and {name} takes most of the wall time", evidence=evidence, check=check),
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


def _stall_findings(report: Report) -> list[Finding]:
    """Timelines whose stalls hold more than :data:`HIGH_STALLS` of their time: named as stalls, not as the phases' cost."""
    findings = []
    for timeline, entry in report.timelines.items():
        if entry.stall_share < HIGH_STALLS:
            continue
        stalled = [stat for stat in entry.phases.values() if stat.stalls and not stat.nested]
        parts = "; ".join(
            f"{stat.title}: {stat.stalls} {'stall' if stat.stalls == 1 else 'stalls'} of up to {stat.stall_max_ms:,.0f} ms (median {stat.p50_ms:,.3f} ms)"
            for stat in stalled
        )
        findings.append(Finding(finding=f"stalls hold {_pct(entry.stall_share)} of the {timeline}'s time",
            evidence=f"{parts}; they are left out of their phases' statistics",
            check="what the host did at those moments (other processes, swapping, I/O, garbage collection): a stall is not the phase's steady cost",
        ))  # fmt: skip
    return findings

"""The bottleneck diagnosis: rules over a measured :class:`~otel_rl.formats.report.Report`.

Shared by ``otel-rl analyze`` (a trace's report, :mod:`otel_rl.readers.analysis.measure`)
and the live verdict (the pipeline's sliding window, :mod:`otel_rl.core.live_verdict`):
one set of rules, one wording, whichever side reads the run. Each verdict says its
side and phase as well as its line, so a page can filter on it and a metric carry it.

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

import statistics
from collections.abc import Sequence

from otel_rl.formats import schema
from otel_rl.formats.report import Diagnosis, Finding, PhaseStats, RankTimeline, Report, Straggler, Timeline, Turns

HIGH_WAIT = 0.25
"""A wait phase above this share of its cycle means the other side holds it up."""
BALANCE_BAND = 0.05
"""A wait within this of :data:`HIGH_WAIT` (20% to 30% of its cycle): neither side clearly sets the pace, the verdict is
``balanced`` (a loop near the line would otherwise be named collector-bound one window and learner-bound the next)."""
BALANCED = "balanced"
"""A verdict's side when neither side clearly sets the pace."""
HIGH_INFERENCE = 0.25
HIGH_REPLAY_BATCH_WAIT = 0.15
HIGH_REPLAY_WRITE = 0.30
HIGH_OTHER = 0.20
HIGH_STALLS = 0.05
"""Stalls holding more than this share of a timeline's time are a finding of their own."""
STRAGGLER_RATIO = 1.2
"""A rank whose phase takes this many times the median rank's (per iteration) is a straggler."""
BUSY_LOAD_PER_CPU = 1.5
"""A host's 1-minute load per core above this: busy (more runnable threads than cores); a verdict read there is less sure."""
UNACCOUNTED = "unaccounted"
"""A verdict's phase when time in no phase holds the pace."""
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
    bottleneck, side, phase, findings = _bottleneck(report)
    rank = None
    found = report.straggler
    if found is not None:  # the job goes at its slowest rank's pace: that is the headline
        ratio = f"{found.ratio:.1f}x the median rank" if found.ratio else "only this rank has it"
        bottleneck = f"{found.timeline} rank {found.rank} ({found.title.lower()}, {ratio}): the straggler"
        side, phase, rank = found.timeline, found.phase, found.rank
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
    return Diagnosis(bottleneck=bottleneck, findings=tuple(findings), side=side, phase=phase, rank=rank)


def _pace_setter(report: Report, timeline: str) -> tuple[str | None, str | None]:
    """What holds ``timeline``'s cycle: (its largest phase, or None when time in no phase outweighs it; the words for it)."""
    if _unaccounted_leads(report, timeline):
        return None, f"unaccounted: {_pct(_other(report, timeline))} of its cycle is in no phase"
    culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
    return culprit, (_title(report, timeline, culprit).lower() if culprit else None)


def _bottleneck(report: Report) -> tuple[str, str | None, str | None, list[Finding]]:
    """Which side sets the pace (the line, its side and phase: ``unaccounted`` for time in no phase), and the finding that says why."""
    L, C = schema.LEARNER, schema.COLLECTOR
    findings: list[Finding] = []
    bottleneck = "none found (no phases in the trace)"
    side: str | None = None
    phase: str | None = None
    have_l, have_c = L in report.timelines, C in report.timelines
    collector_wait = _share(report, L, "collector_wait")
    action_wait = _share(report, C, "learner_action_wait")

    if report.turns is not None:
        bottleneck, side, phase, finding = _in_turns(report, report.turns)
        findings.append(finding)
    elif (have_l and abs(collector_wait - HIGH_WAIT) < BALANCE_BAND) or (
        have_c and collector_wait < HIGH_WAIT and abs(action_wait - HIGH_WAIT) < BALANCE_BAND
    ):
        bottleneck, finding = _balanced(report, collector_wait, action_wait)
        side = BALANCED
        findings.append(finding)
    elif have_l and collector_wait >= HIGH_WAIT:
        culprit, where = _pace_setter(report, C) if have_c else (None, None)
        bottleneck = f"collector ({where or 'not instrumented'})"
        side, phase = C, culprit or (UNACCOUNTED if where else None)
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
        side, phase = L, culprit or (UNACCOUNTED if where else None)
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
        side, phase = L, UNACCOUNTED
        findings.append(_unaccounted_finding(report, L))
    elif have_l:
        culprit = _largest(report, L, exclude=("collector_wait",))
        if culprit:
            bottleneck = f"learner ({_title(report, L, culprit).lower()})"
            side, phase = L, culprit
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
            side, phase = C, culprit or UNACCOUNTED
    return bottleneck, side, phase, findings


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
    log_probs = _share(report, L, "old_log_prob") + _share(report, L, "ref_log_prob")
    if log_probs >= HIGH_LOG_PROB:
        findings.append(Finding(
            finding="the log-prob passes take much of the step",
            evidence=f"Old Log-Prob {_pct(_share(report, L, 'old_log_prob'))} and Ref Log-Prob {_pct(_share(report, L, 'ref_log_prob'))} of Iter Wall",
            check="each is a forward pass over every completion: num_iterations=1 skips the old one and beta=0 the reference one (TRL);"
            " a larger log-prob micro-batch (verl log_prob_micro_batch_size_per_gpu) speeds both",
        ))  # fmt: skip
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


def _balanced(report: Report, collector_wait: float, action_wait: float) -> tuple[str, Finding]:
    """The line for a loop whose waits sit near :data:`HIGH_WAIT`: each side's largest phase and its wait, by their shares."""
    L, C = schema.LEARNER, schema.COLLECTOR
    parts = []
    for timeline, wait, wait_share in ((L, "collector_wait", collector_wait), (C, "learner_action_wait", action_wait)):
        if timeline not in report.timelines:
            continue
        culprit = _largest(report, timeline, exclude=tuple(_WAITS.values()))
        if culprit is not None:
            parts.append(f"{timeline} {_title(report, timeline, culprit).lower()} {_pct(_share(report, timeline, culprit))}")
        if wait in report.timelines[timeline].phases:
            parts.append(f"{_title(report, timeline, wait).lower()} {_pct(wait_share)}")  # its title names whom it waits for
    low, high = _pct(HIGH_WAIT - BALANCE_BAND), _pct(HIGH_WAIT + BALANCE_BAND)
    return f"{BALANCED}: {', '.join(parts)}", Finding(
        finding="neither side clearly sets the pace",
        evidence=f"a wait of {_pct(max(collector_wait, action_wait))} of its cycle is between {low} and {high}: "
        "the side that waits is held up a quarter of its time, the other is not idle",
        check="both: a faster collector and a faster learner each shorten the iteration, neither alone by much",
    )


def _in_turns(report: Report, turns: Turns) -> tuple[str, str | None, str, Finding]:
    """The verdict for a loop that collects and learns in turn: from where the wall time goes."""
    L, C = schema.LEARNER, schema.COLLECTOR
    evidence = f"collection is {_pct(turns.collector)} of wall time, learning {_pct(turns.learner)}, {_pct(turns.outside)} is in neither"
    if turns.outside >= max(turns.collector, turns.learner):
        return (
            f"unaccounted ({_pct(turns.outside)} of wall time is in no iteration)",
            None,
            UNACCOUNTED,
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
        side,
        UNACCOUNTED if _unaccounted_leads(report, side) or culprit is None else culprit,
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
    (schema.LEARNER, "generation"): (
        "generation: fewer completions per prompt (TRL num_generations, verl rollout.n), shorter ones (max_completion_length,"
        " data.max_response_length), more prompts per generate call (per_device_train_batch_size, generation_batch_size), or"
        " a generation server (TRL use_vllm, verl's vLLM or SGLang rollout)"
    ),
    (schema.LEARNER, "reward"): "the reward functions: the slowest is its nested phase (a remote judge, a sandbox, a parser)",
    (schema.LEARNER, "old_log_prob"): "the old policy's log-prob pass: num_iterations=1 (TRL) skips it; a larger log-prob micro-batch speeds it",
    (schema.LEARNER, "ref_log_prob"): "the reference model's log-prob pass: beta=0 skips it (TRL; verl: use_kl_loss and kl_ctrl off)",
    (schema.LEARNER, "weight_publish"): "publishing weights to the generation server: how often (every step) and how (NCCL, not the file system)",
    (schema.LEARNER, "critic_update"): "the critic's update: its epochs, micro-batch size and model size",
}
HIGH_LOG_PROB = 0.25
"""The old and reference log-prob passes together above this share of an LLM-RL step: a finding of their own."""


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


def straggler(ranks: Sequence[RankTimeline], timeline: str = schema.LEARNER) -> Straggler | None:
    """The rank whose top-level phase of work most exceeds the median rank's, per iteration; None when no rank's is
    :data:`STRAGGLER_RATIO` times the median's or more (``ranks``: each rank's table, from a trace or a live window).

    A rank that works longer makes the others wait in their collective, which then exceeds its median on them:
    with two ranks the two excesses are equal. A phase of waiting (:func:`~otel_rl.formats.schema.is_wait`) therefore names a straggler
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

    found = [(per[rank].get(name, 0.0) - median[name], not schema.is_wait(name), rank, name) for rank in per for name in names if slow(rank, name)]
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

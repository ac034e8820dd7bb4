"""The host a run trained on, from the ``sys/*`` counters in its trace, and whether two runs' hosts differed.

A comparison of two runs on hosts that differed (steal, load,
preemptions of the training process) cannot tell the job's
change from the host's; :func:`differences` says what differed, and
:func:`busy_in_both` when both were loaded (noise in both runs).
"""

from __future__ import annotations

import statistics

from otel_rl.formats import diagnosis as rules
from otel_rl.formats import trace

READINGS = {
    "cpu_steal_percent": "sys/cpu_steal_percent",
    "load_per_cpu": "sys/load_per_cpu",
    "involuntary_switches_per_s": "sys/process_involuntary_switches_per_s",
}
"""The report's host readings and the counter each is the median of."""

STEAL_POINTS = 5.0
"""CPU steal (%) differing by more than this many points: the hosts differed."""
LOAD_PER_CPU = 0.5
"""The 1-minute load per core differing by more than this: the hosts differed."""
SWITCHES_RATIO = 3.0
SWITCHES_MIN_PER_S = 50.0
"""The training process preempted this many times more often (and at least this many more per second): the hosts differed."""
BUSY_LOAD_PER_CPU = rules.BUSY_LOAD_PER_CPU
BUSY_SWITCHES_PER_S = 200.0
"""Above either in both runs, the host was busy in both: more runnable threads than cores, or the training process preempted often."""


def readings(system: dict[str, dict[str, list[tuple[int, float]]]]) -> dict[str, float]:
    """The median of each host reading over the run, as the lead process saw it (rank 0's learner, else the process with most samples).

    Each process samples the host from where it stands (a collector's "other
    processes" include the learner): one process's view is read. Its first
    sample, which only starts psutil's measurement, is left out.
    """
    if not system:
        return {}

    def lead(process: str) -> tuple[bool, int]:
        role, rank, _ = trace.parse_process(process)
        return role == "learner" and rank == 0, sum(len(values) for values in system[process].values())

    counters = system[max(system, key=lead)]
    out = {}
    for name, key in READINGS.items():
        values = [value for _, value in sorted(counters.get(key, []))[1:]]
        if values:
            out[name] = statistics.median(values)
    return out


def differences(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """What differed between two runs' hosts, in words (``other processes' CPU 3% -> 48% of the host``); empty when nothing did."""
    found = []
    if _apart(before, after, "cpu_steal_percent", STEAL_POINTS):
        found.append(f"CPU steal {_pair(before, after, 'cpu_steal_percent', '{:.0f}%')}")
    if _apart(before, after, "load_per_cpu", LOAD_PER_CPU):
        found.append(f"load per CPU {_pair(before, after, 'load_per_cpu', '{:.1f}')}")
    switches = (before.get("involuntary_switches_per_s"), after.get("involuntary_switches_per_s"))
    if None not in switches:
        low, high = sorted(switches)
        if high - low > SWITCHES_MIN_PER_S and high > SWITCHES_RATIO * max(low, 1.0):
            found.append(f"the training process preempted {_pair(before, after, 'involuntary_switches_per_s', '{:,.0f}')} times/s")
    return found


def busy_in_both(before: dict[str, float], after: dict[str, float]) -> str | None:
    """Words for a host loaded in both runs, else None."""
    if min(before.get("load_per_cpu", 0.0), after.get("load_per_cpu", 0.0)) >= BUSY_LOAD_PER_CPU:
        return f"load per CPU {_pair(before, after, 'load_per_cpu', '{:.1f}')} in both runs"
    if min(before.get("involuntary_switches_per_s", 0.0), after.get("involuntary_switches_per_s", 0.0)) >= BUSY_SWITCHES_PER_S:
        return f"the training process preempted {_pair(before, after, 'involuntary_switches_per_s', '{:,.0f}')} times/s in both runs"
    return None


def render(host: dict[str, float]) -> str | None:
    """One line of the host's readings, or None without any."""
    if not host:
        return None
    words = {
        "cpu_steal_percent": "steal {:.0f}%",
        "load_per_cpu": "load per CPU {:.2f}",
        "involuntary_switches_per_s": "preempted {:,.0f} times/s",
    }
    return "host (median): " + ", ".join(words[name].format(value) for name, value in host.items())


def _apart(before: dict[str, float], after: dict[str, float], name: str, points: float) -> bool:
    return name in before and name in after and abs(after[name] - before[name]) > points


def _pair(before: dict[str, float], after: dict[str, float], name: str, form: str) -> str:
    return f"{form.format(before[name])} -> {form.format(after[name])}"

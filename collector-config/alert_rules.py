"""Prometheus alerting rules for otel-rl runs, as code; writes ``alerts.yaml`` next to this file.

    python collector-config/alert_rules.py          # rewrite alerts.yaml
    python collector-config/alert_rules.py --check  # fail if the committed file is stale

Metric and phase names come from otel_rl.formats.schema, translated the way the
collector's Prometheus exporter does (dots to underscores, the unit as a
word, ``_total`` on counters); thresholds are the ``for``/window constants
below. Every rule is unit-tested with ``promtool test rules`` against
``alerts.test.yaml`` (tests/test_alert_rules.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from otel_rl.formats import schema

HERE = Path(__file__).parent
RULES_FILE = HERE / "alerts.yaml"

STALLED_FOR = "10m"
"""A run whose iterations stopped advancing for this long is stalled."""
COLLECTOR_WAIT_SHARE = 0.8
"""Share of the collector's cycle spent waiting on the learner that is worth an alert."""
THROUGHPUT_FALL = 0.3
"""A run whose env steps per second fell by more than this share (against :data:`THROUGHPUT_BEFORE` earlier) ..."""
THROUGHPUT_BEFORE = "15m"
"""... while its live verdict changed within that time: a new bottleneck cost it throughput."""


def _prometheus(name: str, unit: str = "", counter: bool = False) -> str:
    words = {"ms": "milliseconds", "s": "seconds", "By": "bytes"}
    out = name.replace(".", "_")
    if unit in words:
        out += "_" + words[unit]
    return out + ("_total" if counter else "")


def _label(attribute: str) -> str:
    return attribute.replace(".", "_")


def _rule(name: str, expr: str, severity: str, summary: str, description: str, wait: str | None = None) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if wait:
        rule["for"] = wait
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def rules() -> dict:
    iterations = _prometheus(schema.METRIC_ITERATION_DURATION, "ms") + "_count"
    iteration_sum = _prometheus(schema.METRIC_ITERATION_DURATION, "ms") + "_sum"
    phase_sum = _prometheus(schema.METRIC_PHASE_DURATION, "ms") + "_sum"
    events = _prometheus(schema.METRIC_EVENTS, counter=True)
    dropped = _prometheus(schema.METRIC_DROPPED, counter=True)
    active = _prometheus(schema.METRIC_RUN_ACTIVE)
    env_steps = _prometheus(schema.METRIC_ENV_STEPS, counter=True)
    bottleneck = _prometheus(schema.METRIC_BOTTLENECK)
    run, timeline, phase = _label(schema.ATTR_RUN_ID), _label(schema.ATTR_TIMELINE), _label(schema.ATTR_PHASE)
    event, queue = _label(schema.ATTR_EVENT), _label(schema.ATTR_QUEUE)
    wait = schema.phase_spec(schema.COLLECTOR, "learner_action_wait")
    on_run = "{{ $labels.%s }}" % run
    return {
        "groups": [
            {
                "name": "otel-rl",
                "rules": [
                    _rule(
                        "RLRunStalled",
                        f'sum by ({run}) (increase({iterations}{{{timeline}="{schema.LEARNER}"}}[{STALLED_FOR}])) == 0'
                        f" and on ({run}) max by ({run}) ({active}) == 1",
                        "critical",
                        f"Run {on_run} completed no learner iteration in {STALLED_FOR}",
                        "Its telemetry still exports and the run has not ended, so the process lives: a hang, a deadlock"
                        " or a stuck collector.",
                        wait="1m",
                    ),
                    _rule(
                        "RLNonFiniteValues",
                        f'sum by ({run}) (increase({events}{{{event}="nonfinite"}}[5m])) > 0',
                        "warning",
                        f"Run {on_run} reported NaN or infinite values",
                        "A loss or metric turned non-finite; the nonfinite events name the keys.",
                    ),
                    _rule(
                        "RLWorkerCrashed",
                        f'sum by ({run}) (increase({events}{{{event}="worker_crashed"}}[5m])) > 0',
                        "critical",
                        f"A worker process of run {on_run} crashed",
                        "The worker_crashed event carries its role and exit code.",
                    ),
                    _rule(
                        "RLTelemetryDropping",
                        f'sum by ({run}, {queue}) (increase({dropped}{{{queue}!="span_budget"}}[10m])) > 0',
                        "warning",
                        f"Run {on_run} drops telemetry in queue {{{{ $labels.{queue} }}}}",
                        "An output cannot keep up or is failing; training is not slowed, records are lost.",
                        wait="5m",
                    ),
                    _rule(
                        "RLCollectorWaitsOnLearner",
                        f'sum by ({run}) (rate({phase_sum}{{{timeline}="{schema.COLLECTOR}", {phase}="{wait.name}"}}[5m]))'
                        f' / sum by ({run}) (rate({iteration_sum}{{{timeline}="{schema.COLLECTOR}"}}[5m]))'
                        f" > {COLLECTOR_WAIT_SHARE}",
                        "info",
                        f"Collectors of run {on_run} wait on the learner for most of their cycle",
                        f"{wait.title} is over {COLLECTOR_WAIT_SHARE:.0%} of the collector cycle: the learner is the bottleneck.",
                        wait="10m",
                    ),
                    _rule(
                        "RLBottleneckChangedAndSlower",
                        f"max by ({run}) (rate({env_steps}[5m])) < {1 - THROUGHPUT_FALL:g} * max by ({run}) (rate({env_steps}[5m] offset {THROUGHPUT_BEFORE}))"
                        f' and on ({run}) sum by ({run}) (increase({events}{{{event}="{schema.EVENT_BOTTLENECK}"}}[{THROUGHPUT_BEFORE}])) > 0',
                        "warning",
                        f"Run {on_run} slowed by more than {THROUGHPUT_FALL:.0%} and its bottleneck changed",
                        f"Env steps per second fell by more than {THROUGHPUT_FALL:.0%} against {THROUGHPUT_BEFORE} earlier while the live"
                        f" verdict changed: {bottleneck} and the run's page name the new bottleneck.",
                        wait="2m",
                    ),
                ],
            }
        ]
    }


def render() -> str:
    header = "# Generated by collector-config/alert_rules.py from otel_rl.formats.schema; do not edit by hand.\n"
    return header + yaml.safe_dump(rules(), sort_keys=False, width=200)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not RULES_FILE.exists() or RULES_FILE.read_text() != text:
            print(f"{RULES_FILE} is stale: run python collector-config/alert_rules.py", file=sys.stderr)
            return 1
        return 0
    RULES_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

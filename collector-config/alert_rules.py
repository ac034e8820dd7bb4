"""Prometheus alerting rules for otel-rl runs, as code; writes ``alerts.yaml`` next to this file.

    python collector-config/alert_rules.py          # rewrite alerts.yaml
    python collector-config/alert_rules.py --check  # fail if the committed file is stale

Metric and phase names come from otel_rl.schema, translated the way the
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

from otel_rl import schema

HERE = Path(__file__).parent
RULES_FILE = HERE / "alerts.yaml"

STALLED_FOR = "10m"
"""A run whose iterations stopped advancing for this long is stalled."""
COLLECTOR_WAIT_SHARE = 0.8
"""Share of the collector's cycle spent waiting on the learner that is worth an alert."""


def _prometheus(name: str, unit: str = "", counter: bool = False) -> str:
    words = {"ms": "milliseconds", "s": "seconds", "By": "bytes"}
    out = name.replace(".", "_")
    if unit in words:
        out += "_" + words[unit]
    return out + ("_total" if counter else "")


def _label(attribute: str) -> str:
    return attribute.replace(".", "_")


def rules() -> dict:
    iterations = _prometheus(schema.METRIC_ITERATION_DURATION, "ms") + "_count"
    iteration_sum = _prometheus(schema.METRIC_ITERATION_DURATION, "ms") + "_sum"
    phase_sum = _prometheus(schema.METRIC_PHASE_DURATION, "ms") + "_sum"
    events = _prometheus(schema.METRIC_EVENTS, counter=True)
    dropped = _prometheus(schema.METRIC_DROPPED, counter=True)
    run, timeline, phase = _label(schema.ATTR_RUN_ID), _label(schema.ATTR_TIMELINE), _label(schema.ATTR_PHASE)
    event, queue = _label(schema.ATTR_EVENT), _label(schema.ATTR_QUEUE)
    wait = schema.phase_spec(schema.COLLECTOR, "learner_action_wait")
    return {
        "groups": [
            {
                "name": "otel-rl",
                "rules": [
                    {
                        "alert": "RLRunStalled",
                        "expr": f'sum by ({run}) (increase({iterations}{{{timeline}="{schema.LEARNER}"}}[{STALLED_FOR}])) == 0',
                        "for": "1m",
                        "labels": {"severity": "critical"},
                        "annotations": {
                            "summary": "Run {{ $labels.%s }} completed no learner iteration in %s" % (run, STALLED_FOR),
                            "description": "Its telemetry still exports, so the process lives: a hang, a deadlock or a stuck collector.",
                        },
                    },
                    {
                        "alert": "RLNonFiniteValues",
                        "expr": f'sum by ({run}) (increase({events}{{{event}="nonfinite"}}[5m])) > 0',
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "Run {{ $labels.%s }} reported NaN or infinite values" % run,
                            "description": "A loss or metric turned non-finite; the nonfinite events name the keys.",
                        },
                    },
                    {
                        "alert": "RLWorkerCrashed",
                        "expr": f'sum by ({run}) (increase({events}{{{event}="worker_crashed"}}[5m])) > 0',
                        "labels": {"severity": "critical"},
                        "annotations": {
                            "summary": "A worker process of run {{ $labels.%s }} crashed" % run,
                            "description": "The worker_crashed event carries its role and exit code.",
                        },
                    },
                    {
                        "alert": "RLTelemetryDropping",
                        "expr": f'sum by ({run}, {queue}) (increase({dropped}{{{queue}!="span_budget"}}[10m])) > 0',
                        "for": "5m",
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "Run {{ $labels.%s }} drops telemetry in queue {{ $labels.%s }}" % (run, queue),
                            "description": "An output cannot keep up or is failing; training is not slowed, records are lost.",
                        },
                    },
                    {
                        "alert": "RLCollectorWaitsOnLearner",
                        "expr": (
                            f'sum by ({run}) (rate({phase_sum}{{{timeline}="{schema.COLLECTOR}", {phase}="{wait.name}"}}[5m]))'
                            f' / sum by ({run}) (rate({iteration_sum}{{{timeline}="{schema.COLLECTOR}"}}[5m]))'
                            f" > {COLLECTOR_WAIT_SHARE}"
                        ),
                        "for": "10m",
                        "labels": {"severity": "info"},
                        "annotations": {
                            "summary": "Collectors of run {{ $labels.%s }} wait on the learner for most of their cycle" % run,
                            "description": f"{wait.title} is over {COLLECTOR_WAIT_SHARE:.0%} of the collector cycle: the learner is the bottleneck.",
                        },
                    },
                ],
            }
        ]
    }


def render() -> str:
    header = "# Generated by collector-config/alert_rules.py from otel_rl.schema; do not edit by hand.\n"
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

"""The run's lifecycle has one home, and it is the protocol's: the JSON Schema's status enum."""

from __future__ import annotations

import json
from importlib import resources

from otel_rl.core.records import RunEnd
from otel_rl.formats import lifecycle


def test_the_statuses_are_the_protocols():
    schema = json.loads(resources.files("otel_rl.formats").joinpath("motrix-metrics-v1.schema.json").read_text())
    enums = [node["enum"] for node in _nodes(schema) if isinstance(node, dict) and "status" == node.get("_name")]
    assert [status.value for status in lifecycle.RunStatus] == enums[0] == ["pending", "running", "finished", "failed", "killed"]
    assert lifecycle.TERMINAL == {"finished", "failed", "killed"} and lifecycle.LOST not in enums[0]
    assert lifecycle.STATUSES == ("pending", "running", "finished", "failed", "killed", "lost")


def test_a_record_carries_the_status_as_plain_text():
    end = RunEnd(lifecycle.FAILED, 1, 2, "boom")
    assert type(end.status) is str and end.status == "failed" and json.dumps(end.status) == '"failed"'


def _nodes(node, name=None):
    """Every schema node, each dict tagged with the property name it sits under."""
    if isinstance(node, dict):
        yield {**node, "_name": name}
        for key, value in node.items():
            yield from _nodes(value, key if key != "properties" else name)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value, name)

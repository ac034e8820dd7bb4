"""Runs written before the metric schema: their TensorBoard event files, read through :func:`otel_rl.formats.schema.migrate_legacy`.

Seed 001's ``--legacy-unversioned`` path, and its rules: only a folder with
no schema stamp (no ``run_summary.json`` naming a ``metric_schema_version``)
and no canonical tag is read, each step's recognised legacy tags (APPO's
``timing/collector_*_ms`` among them) translated to canonical keys in their
units, retired tags left out. Anything else fails closed: a reader never
guesses at a run it cannot place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_rl.base.extras import Extra, require
from otel_rl.formats import schema

TENSORBOARD = Extra("reading pre-schema runs (legacy_unversioned)", "tensorboard", "tensorboard")


class LegacyRunError(ValueError):
    """The folder is not a pre-schema run this reader may translate; the message says why."""


def legacy_points(folder: str | Path) -> dict[int, dict[str, float | None]]:
    """Each step's values of the pre-schema run in ``folder`` (its event files, in any subfolder), in canonical keys.

    Raises:
        LegacyRunError: no event files; a schema stamp; a canonical tag; or a step that mixes them.
        MissingExtra: the ``tensorboard`` package is not installed.
    """
    folder = Path(folder)
    summary = folder / "run_summary.json"
    if summary.is_file():
        try:
            stamped = "metric_schema_version" in json.loads(summary.read_text())
        except (OSError, ValueError):
            stamped = False
        if stamped:
            raise LegacyRunError(f"{folder} is stamped with a metric schema version (run_summary.json): it is not a pre-schema run")
    files = sorted(folder.rglob("events.out.tfevents.*"))
    if not files:
        raise LegacyRunError(f"{folder} holds no TensorBoard event files (events.out.tfevents.*)")
    require(TENSORBOARD)
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    by_step: dict[int, dict[str, float | None]] = {}
    for path in files:
        for event in EventFileLoader(str(path)).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _number(value)
                if number is not None:
                    by_step.setdefault(int(event.step), {})[value.tag] = number
    canonical = sorted({tag for values in by_step.values() for tag in values if tag in schema.METRICS})
    if canonical:
        raise LegacyRunError(f"{folder} has canonical tags ({canonical[0]!r}...): it is not a pre-schema run; read it as it is")
    try:
        return {step: schema.migrate_legacy(values) for step, values in sorted(by_step.items())}
    except schema.SchemaError as exc:
        raise LegacyRunError(f"{folder}: {exc}") from None


def _number(value: Any) -> float | None:
    """A summary value's number: a simple value, or a scalar tensor as TensorBoard 2 writes them."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.tensor.float_val:
        return float(value.tensor.float_val[0])
    if value.HasField("tensor") and value.tensor.double_val:
        return float(value.tensor.double_val[0])
    return None

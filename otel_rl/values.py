"""Turning user values into plain numbers.

:func:`snapshot` runs on the training thread: it copies the mapping and
converts numpy and torch values with at most one host transfer per call (all
tensors are stacked and copied together), so a dict of 40 CUDA scalars costs
one device synchronization, not forty. Plain ints and floats pass through
untouched. :func:`finite_or_none` runs on the pipeline thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

def snapshot(values: Mapping[str, Any]) -> dict[str, Any]:
    """Copy ``values`` into a dict of ints, floats, bools and leftovers.

    Raises:
        TypeError: ``values`` is not a mapping with string keys.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"scalars() takes a mapping of key to number, got {type(values).__name__}")
    out = dict(values)
    tensors: list[str] | None = None
    for key, value in out.items():
        kind = type(value)
        if kind is float or kind is int:
            continue
        if not isinstance(key, str):
            raise TypeError(f"scalars() keys must be strings, got {key!r}")
        module = kind.__module__
        if module.startswith("torch"):
            if tensors is None:
                tensors = []
            tensors.append(key)
        elif module.startswith("numpy"):
            out[key] = value.item() if getattr(value, "size", 1) == 1 else value
    if tensors:
        _tensors_to_host(out, tensors)
    return out


def _tensors_to_host(out: dict[str, Any], keys: list[str]) -> None:
    import torch  # only reached when the caller passed torch values

    single = [k for k in keys if out[k].numel() == 1]
    if not single:
        return
    # One stack, one copy: a single host transfer for every tensor of the call.
    # Tensors on different devices are moved per device.
    by_device: dict[Any, list[str]] = {}
    for key in single:
        by_device.setdefault(out[key].device, []).append(key)
    for group in by_device.values():
        stacked = torch.stack([out[k].detach().reshape(()).to(torch.float64) for k in group])
        for key, number in zip(group, stacked.cpu().tolist(), strict=True):
            out[key] = number


def finite_or_none(key: str, value: Any) -> float | int | None:
    """The value as a finite number, or None for NaN, Inf and non-numbers."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        from otel_rl.recorder import warn_once

        warn_once(f"value:{key}", "otel-rl: scalar %r is not a number (%s); exported as null", key, type(value).__name__)
        return None
    return number if math.isfinite(number) else None

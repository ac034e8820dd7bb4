"""Distributions of values (actions, advantages, gradient norms) for :meth:`otel_rl.Telemetry.distribution`.

On the training thread, :func:`to_host_array` makes a private float64 copy
of what was passed, with one host transfer for a tensor: at most
:data:`MAX_VALUES` values (a larger input is strided evenly on its device
first, so the transfer stays bounded). Everything else happens on the
pipeline thread: :func:`summarize` computes the statistics that join the
live records as ``<key>/<stat>`` scalars (:data:`otel_rl.formats.schema.DISTRIBUTION_STATS`)
and the :class:`Histogram` the experiment trackers draw; the OpenTelemetry
histogram ``rl.distribution`` bins the same values on fixed bounds
(:mod:`otel_rl.outputs.otel.aggregation`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from otel_rl.base.log import logger, once
from otel_rl.base.values import MAX_REPR, clean_text
from otel_rl.formats import schema

_logger = logger(__name__)

MAX_VALUES = 1 << 20
"""Values kept per call; a larger input is evenly strided down to this many."""
HISTOGRAM_BINS = 30


class Histogram(NamedTuple):
    """Equal-width bins over the finite values of one call (the shape TensorBoard and W&B draw)."""

    counts: list[int]
    edges: list[float]
    count: int
    total: float
    sum_squares: float
    minimum: float
    maximum: float


class Summary(NamedTuple):
    """What the pipeline makes of one call: its finite values, their statistics (None when there are none), histogram, and how many were not finite."""

    values: Any
    stats: dict[str, float | None]
    histogram: Histogram | None
    nonfinite: int


def to_host_array(values: Any, key: Any) -> Any:
    """A 1-D float64 numpy copy of ``values`` (a tensor, array, sequence or number), or None with one warning.

    A tensor is copied to the host once (after a strided selection on its
    device when it holds more than :data:`MAX_VALUES` elements).
    """
    import numpy as np

    try:
        if type(values).__module__.startswith("torch"):
            array = _tensor_to_host(values)
        else:
            array = np.asarray(values)
            if array.dtype == object or array.dtype.kind not in "biuf":
                raise TypeError(f"dtype {array.dtype}")
            array = array.reshape(-1)
            if array.size > MAX_VALUES:
                array = array[:: -(-array.size // MAX_VALUES)]
        array = np.array(array, dtype=np.float64, copy=True).reshape(-1)
    except Exception as exc:
        _logger.warning(
            "otel-rl: distribution() %r takes numbers (a tensor, array or sequence), got %s (%s); dropped",
            key,
            clean_text(type(values).__name__, MAX_REPR),
            exc,
            extra=once(f"distribution-type:{key!r}"),
        )
        return None
    if array.size == 0:
        _logger.warning("otel-rl: distribution() %r is empty; dropped", key, extra=once(f"distribution-empty:{key!r}"))
        return None
    return array


def _tensor_to_host(tensor: Any) -> Any:
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(type(tensor).__name__)
    if tensor.is_complex():
        raise TypeError(f"dtype {tensor.dtype}")
    flat = tensor.detach().reshape(-1)
    if flat.numel() > MAX_VALUES:
        flat = flat[:: -(-flat.numel() // MAX_VALUES)]
    if flat.dtype not in (torch.float64, torch.float32):
        flat = flat.to(torch.float32)  # bfloat16, float16, ints and bools have no direct numpy view
    return flat.cpu().numpy()  # the one host transfer (a CPU tensor's view is copied by the caller)


def summarize(array: Any) -> Summary:
    """Statistics and histogram of the finite values of ``array`` (pipeline thread)."""
    import numpy as np

    finite = np.isfinite(array)
    nonfinite = int(array.size - np.count_nonzero(finite))
    if nonfinite:
        array = array[finite]
    if array.size == 0:
        return Summary(array, dict.fromkeys(schema.DISTRIBUTION_STATS), None, nonfinite)
    minimum, maximum = float(array.min()), float(array.max())
    quantiles = np.quantile(array, list(schema.DISTRIBUTION_QUANTILES.values()))
    stats: dict[str, float | None] = {
        "min": minimum,
        "mean": float(array.mean()),
        "max": maximum,
        "std": float(array.std()),
        **{name: float(q) for name, q in zip(schema.DISTRIBUTION_QUANTILES, quantiles)},
    }
    counts, edges = np.histogram(array, bins=HISTOGRAM_BINS if maximum > minimum else 1)
    histogram = Histogram(
        counts.tolist(), edges.tolist(), int(array.size), float(array.sum()), float(np.dot(array, array)), minimum, maximum
    )
    return Summary(array, stats, histogram, nonfinite)

"""Which scalar keys are exported, and under what name: the key policy of a producer's pipeline."""

from __future__ import annotations

import re

from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.base.values import MAX_REPR, clean_text, describe, shorten
from otel_rl.formats import schema

_logger = logger(__name__)

MAX_SCALAR_KEYS = 10_000
"""Distinct scalar keys per run; values of further new keys are dropped and counted (queue ``scalar_keys``)."""


class KeyPolicy:
    """The exported name of each key a producer logs, decided once per key (pipeline thread).

    Canonical keys go out as they are; other strings are namespaced under
    ``custom/`` with one warning; keys longer than the protocol allows are
    shortened (a hash keeps them distinct). Not exported: keys that are not
    strings (``1`` and ``"1"`` would otherwise collide), internal weighting
    counts of :mod:`otel_rl.stats_tracker` (``key__count``), and new keys past
    :data:`MAX_SCALAR_KEYS` (counted as drops).
    """

    def __init__(self, drops: Drops) -> None:
        self._drops = drops
        self._accepted: dict[str, str] = {}
        self.canonical: set[str] = set()
        """Keys exported as they are: calls of only these need no check key by key."""

    def key(self, raw_key: object) -> str:
        """The exported key of ``raw_key`` (remembered), "" when it is not exported."""
        key = self._accepted.get(raw_key) if type(raw_key) is str else None
        return self._accept(raw_key) if key is None else key

    def accept_all(self, names: tuple[str, ...]) -> bool:
        """Accept every one of ``names`` (warning once for each new one); whether all are exported as they are."""
        if not set(names) <= self.canonical and len(self._accepted) + len(names) <= MAX_SCALAR_KEYS:
            for name in names:
                self.key(name)
        return set(names) <= self.canonical

    def _accept(self, raw_key: object) -> str:
        if not isinstance(raw_key, str):
            _logger.warning(
                "otel-rl: scalars()/distribution() key %s (%s) is not a string; its value is dropped",
                describe(raw_key),
                type(raw_key).__name__,
                extra=once(f"key-type:{type(raw_key).__name__}"),
            )
            return ""
        if type(raw_key) is not str:  # a str subclass (StrEnum, numpy.str_): its text
            raw_key = str.__str__(raw_key)
            known = self._accepted.get(raw_key)
            if known is not None:
                return known
        if len(self._accepted) >= MAX_SCALAR_KEYS:
            self._drops.add("scalar_keys", "scalars")
            _logger.warning("otel-rl: more than %d distinct scalar keys; values of new keys are dropped and counted", MAX_SCALAR_KEYS)
            return ""
        if raw_key.endswith("__count"):
            _logger.warning("otel-rl: %r is a stats weighting count; such keys are not exported", raw_key)
            self._accepted[raw_key] = ""
            return ""
        try:
            key = schema.metric_spec(raw_key).key
        except schema.SchemaError as exc:
            key = shorten(clean_text("custom/" + (re.sub(r"[^A-Za-z0-9_.\-]", "_", raw_key) or "unnamed")))
            # An over-long key is named shortened, not in full, in the warning.
            _logger.warning("otel-rl: %s; exporting it as %r", clean_text(str(exc), MAX_REPR), key, extra=once(f"key:{raw_key}"))
        key = shorten(clean_text(key))
        self._accepted[raw_key] = key
        if key == raw_key:
            self.canonical.add(key)
        return key

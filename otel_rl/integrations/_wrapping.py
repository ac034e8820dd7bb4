"""How the integrations time a library's methods: wrappers set on the instances they instrument."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.formats import schema

_ORIGINAL = "__otel_rl_original__"
"""Set on a wrapper: what it wraps, and whether that was the instance's own attribute (a second
instrumentation replaces the first wrapper instead of stacking on it)."""


def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``owner.name`` by ``make(original)`` on the instance; returns the function that undoes it.

    ``original`` is what the instance had before any otel-rl wrapper: wrapping
    an instrumented method again (an integration set up twice, or left in place
    by a training call that raised) replaces the wrapper, so nothing is timed twice.
    """
    current = getattr(owner, name)
    original, had_own = getattr(current, _ORIGINAL, (current, name in getattr(owner, "__dict__", {})))
    wrapper = make(original)
    try:
        setattr(wrapper, _ORIGINAL, (original, had_own))
    except (AttributeError, TypeError):  # a wrapper that takes no attributes is not recognised later
        pass
    setattr(owner, name, wrapper)

    def undo() -> None:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    return undo


def timed(
    tel: TrainingTelemetry,
    phase: str,
    method: Callable[..., Any],
    timeline: str = schema.COLLECTOR,
    when: Callable[[], bool] | None = None,
) -> Callable[..., Any]:
    """``method`` recorded as ``phase`` of ``timeline`` on every call (also when it raises), or only while ``when()``."""
    recorded = tel.phase(phase, timeline)  # resolved once: entering it costs a fraction of record_phase

    def call(*args: Any, **kwargs: Any) -> Any:
        if when is not None and not when():
            return method(*args, **kwargs)
        with recorded:
            return method(*args, **kwargs)

    return call


def saves(tel: TrainingTelemetry, method: Callable[..., Any], attributes: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """``method`` (a library's save) followed, when it returns, by a ``checkpoint_saved`` event with ``attributes(*args, **kwargs)``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        try:
            found = attributes(*args, **kwargs)
        except Exception:  # an unexpected call shape: the checkpoint is saved, the event says less
            found = {}
        tel.event(schema.EVENT_CHECKPOINT_SAVED, **found)
        return result

    return call


def path_argument(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """A save's ``path`` (its first argument or ``path=``), as the event's attribute."""
    path = kwargs.get("path", args[0] if args else None)
    return {} if path is None else {"path": str(path)}


def time_forward(tel: TrainingTelemetry, module: Any, phase: str, when: Callable[[], bool]) -> Callable[[], None]:
    """Record ``module``'s forward passes made while ``when()`` as ``phase`` of the collector; returns the undo.

    Forward hooks, because the library calls the module itself: its own
    ``__call__`` cannot be wrapped on the instance.
    """
    started = [0]

    def begins(module: Any, inputs: Any) -> None:
        if when():
            started[0] = perf_counter_ns()

    def ends(module: Any, inputs: Any, outputs: Any) -> None:
        if started[0]:
            tel.record_phase(phase, started[0], perf_counter_ns(), schema.COLLECTOR)
            started[0] = 0

    handles = (module.register_forward_pre_hook(begins), module.register_forward_hook(ends))
    return lambda: [handle.remove() for handle in handles]


class Cycle:
    """The collector iteration that one library callback opens and another closes (one open at a time).

    ``count`` is the number of cycles closed so far, and the index of the next.
    """

    def __init__(self, tel: TrainingTelemetry) -> None:
        self.tel = tel
        self.count = 0
        self._open: Any = None

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def begin(self, env_steps: int | None) -> None:
        """Open the next cycle at ``env_steps``, unless one is open."""
        if self._open is None:
            cycle = self.tel.iteration(self.count, env_steps=env_steps, timeline=schema.COLLECTOR)
            cycle.__enter__()
            self._open = cycle

    def end(self) -> None:
        """Close the open cycle, if any."""
        cycle, self._open = self._open, None
        if cycle is not None:
            cycle.__exit__(None, None, None)
            self.count += 1


def opens_run(tel: TrainingTelemetry, method: Callable[..., Any], metadata: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """``method`` (a library's training entry point) run inside a run of its own when none is open.

    ``metadata(*args, **kwargs)`` gives :meth:`otel_rl.Telemetry.start_run`'s
    arguments from the call's. The run ends with the call: finished when it
    returns, failed (or killed) as what it raises ends it.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        opened = tel.start_run(**metadata(*args, **kwargs))
        try:
            result = method(*args, **kwargs)
        except BaseException as exc:
            if opened:
                tel.end_run(exc)
            raise
        if opened:
            tel.end_run()
        return result

    return call


def settings(config: Any) -> dict[str, Any]:
    """A library's configuration object (a mapping, a dataclass, or None) as a mapping of its settings."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config)}
    return {}


def plain_settings(settings: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The public entries of a library's settings that are configuration, not objects: its configuration as the run records it.

    Kept: None, numbers, strings, booleans, enums, devices, classes (by their
    qualified name) and lists, tuples (named tuples as mappings) and mappings
    of these (``policy_kwargs``, ``net_arch``, ``train_freq``, ``seed``);
    left out: everything else (the policy, the environment, buffers, loggers).
    """
    kept = {}
    for name, value in settings.items():
        if str(name).startswith("_") or name in skip:
            continue
        plain = _plain(value, _SETTING_DEPTH)
        if plain is not _NOT_PLAIN:
            kept[name] = plain
    return kept


_SETTING_DEPTH = 4
_NOT_PLAIN = object()


def _plain(value: Any, depth: int) -> Any:
    """``value`` as configuration (see :func:`plain_settings`), or ``_NOT_PLAIN``."""
    if value is None or type(value) in (int, float, str, bool):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if type(value).__name__ == "device" and type(value).__module__ == "torch":
        return str(value)
    if depth == 0:
        return _NOT_PLAIN
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, Mapping):
        items = {str(k): _plain(v, depth - 1) for k, v in value.items()}
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items.values()) else items
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth - 1) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    return _NOT_PLAIN


_INNER = ("base_env", "venv", "_env", "env")
"""Where a wrapper (TorchRL's TransformedEnv, SB3's VecNormalize, skrl's and Gymnasium's wrappers) keeps what it wraps."""


def environment_name(env: Any) -> str | None:
    """The name of the environment ``env`` steps (a Gymnasium spec's id, TorchRL's ``env_name``), unwrapping; None when unknown."""
    for _ in range(8):  # wrappers nest a few deep, never this deep
        name = getattr(getattr(env, "spec", None), "id", None)
        if not isinstance(name, str):
            name = getattr(env, "env_name", None)
        if isinstance(name, str) and name:
            return name
        get_attr = getattr(env, "get_attr", None)
        if callable(get_attr) and hasattr(env, "num_envs"):  # an SB3 vectorised env: its first env's spec
            try:
                name = getattr(get_attr("spec", indices=[0])[0], "id", None)
            except Exception:  # a library's env that does not have it
                name = None
            if isinstance(name, str) and name:
                return name
        env = next((inner for attribute in _INNER if (inner := getattr(env, attribute, None)) is not None), None)
        if env is None:
            return None
    return None

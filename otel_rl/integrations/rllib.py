"""RLlib (Ray, new API stack): ``config.callbacks(TelemetryCallbacks.for_run(tel))``.

:meth:`TelemetryCallbacks.for_run` makes a callbacks class that carries the
run (its id, the run span's trace context, the run folder) to wherever RLlib
instantiates it: the driver and every EnvRunner actor. Then:

- on the driver, each ``training_step`` is a ``learner`` iteration with
  ``collector_wait`` (waiting for the EnvRunners' samples, not for state syncs), ``learning``
  (the learner group's update) and ``weight_publish`` (syncing weights back to
  the EnvRunners); each training result goes to ``tel.scalars`` (flattened,
  under canonical keys: ``otel_rl.formats.schema.LIBRARY_TAGS["rllib"]``) at the
  env steps sampled so far;
- each EnvRunner actor (a process Ray scheduled, on this machine or another)
  starts its own telemetry in the run's trace (:func:`otel_rl.worker_processes.init_worker`):
  each ``sample()`` call is a ``collector`` iteration with ``policy_inference``
  (the RLModule's forward pass), ``env_step``, ``env_to_module`` and
  ``module_to_env`` (the connector pipelines on either side of the forward
  pass, most of an env runner's time on small models) and
  ``episode_bookkeeping`` (the episode callbacks and sample counters) phases; its spans are
  children of the run span in OTLP, its Perfetto fragment becomes its own
  process in the run's trace when the driver closes, and a summary of each
  cycle travels back over a Ray queue so the learner's panel and live
  metrics show the collectors. Its telemetry is closed when RLlib stops the
  EnvRunner (``algo.stop()``): stop the algorithm before ``tel.close()``.

When no run is open, the algorithm's life is the run: opened when it is
built (with its settings and number of environments), finished by
``algo.stop()`` or ``tel.close()``.

Call ``for_run`` after ``ray.init()`` (the relay queue is a Ray actor).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any, ClassVar

from otel_rl.api import TrainingTelemetry
from otel_rl.base import extras

extras.require(extras.INTEGRATIONS["rllib"])  # an error naming the extra, before the library's own import fails

from ray.rllib.callbacks.callbacks import RLlibCallback

from otel_rl.formats import schema
from otel_rl.integrations._wrapping import plain_settings, timed, wrap
from otel_rl.training.workers import RELAY_CAPACITY, WorkerSpec
from otel_rl.worker_processes import init_worker

SYSTEM = "rllib"
"""``rl.system`` of runs trained with RLlib."""

_DRIVERS: dict[str, Any] = {}
"""The driver's telemetry by run id, for callbacks instantiated in the driver's own process."""


class TelemetryCallbacks(RLlibCallback):
    """RLlib callbacks recording the driver and every EnvRunner of one run (use :meth:`for_run`)."""

    spec: ClassVar[WorkerSpec | None] = None

    @classmethod
    def for_run(cls, tel: TrainingTelemetry, **options: Any) -> type[TelemetryCallbacks]:
        """The callbacks class of ``tel``'s run; ``options`` go to each EnvRunner's :func:`otel_rl.init`."""
        relay = None
        if tel.enabled:
            from ray.util.queue import Queue

            relay = Queue(maxsize=RELAY_CAPACITY)
            _DRIVERS[tel.run_id] = tel
        spec = tel.worker_spec("env runner", relay=relay, **options)
        name = "TelemetryCallbacks_" + re.sub(r"\W", "_", spec.run_id or "disabled")
        return type(name, (cls,), {"spec": spec})

    def __init__(self) -> None:
        super().__init__()
        self._tel: TrainingTelemetry = None
        self._samples = 0

    # -- the driver -------------------------------------------------------------

    def on_algorithm_init(self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        tel = _DRIVERS.get(self.spec.run_id) if self.spec is not None else None
        if tel is None:
            return
        state = {"syncing": False, "iterations": 0}

        def training_step(original):
            def wrapped(*args: Any, **kwargs: Any):
                with tel.iteration(state["iterations"], env_steps=_env_steps(algorithm)):
                    result = original(*args, **kwargs)
                state["iterations"] += 1
                return result

            return wrapped

        def syncing(original):
            def wrapped(*args: Any, **kwargs: Any):
                state["syncing"] = True  # syncing weights or connector states, or stopping, is not waiting for samples
                try:
                    return original(*args, **kwargs)
                finally:
                    state["syncing"] = False

            return wrapped

        def sampling() -> bool:
            return not state["syncing"]

        config = algorithm.config
        tel.describe_system(SYSTEM, _environment_name(config), type(algorithm).__name__)
        runners_count = max(1, int(getattr(config, "num_env_runners", 0) or 0))
        if tel.start_run(
            family="rl.onpolicy" if type(algorithm).__name__ in _ON_POLICY else "rl.offpolicy",
            num_envs=runners_count * int(getattr(config, "num_envs_per_env_runner", 1) or 1),
            config={"algorithm": type(algorithm).__name__, **_plain_config(config)},
        ):
            wrap(algorithm, "stop", lambda stop: _ending_run(tel, stop))
        wrap(algorithm, "training_step", training_step)
        wrap(algorithm.learner_group, "update", lambda update: timed(tel, "learning", update, schema.LEARNER))
        runners = algorithm.env_runner_group
        if runners is not None:
            wrap(runners, "foreach_env_runner", lambda call: timed(tel, "collector_wait", call, schema.LEARNER, when=sampling))
            wrap(runners, "sync_weights", lambda sync: syncing(timed(tel, "weight_publish", sync, schema.LEARNER)))
            wrap(runners, "sync_env_runner_states", syncing)
            wrap(runners, "stop", syncing)

    def on_train_result(self, *, algorithm: Any, metrics_logger: Any = None, result: dict, **kwargs: Any) -> None:
        tel = _DRIVERS.get(self.spec.run_id) if self.spec is not None else None
        if tel is not None:
            values = {schema.library_key("rllib", k): v for k, v in _flatten(result).items()}
            steps = _env_steps(algorithm)  # after this iteration's sampling: the iteration itself started at the count before it
            tel.scalars(values, step=steps, env_steps=steps)

    # -- each EnvRunner ------------------------------------------------------------

    def on_environment_created(self, *, env_runner: Any, env: Any, **kwargs: Any) -> None:
        if self.spec is None or not self.spec.run_id:
            return
        if self._tel is None:  # the first environment of this EnvRunner
            driver = _DRIVERS.get(self.spec.run_id)  # set when this is the driver's own (local) EnvRunner
            if driver is None:
                role = f"env runner {getattr(env_runner, 'worker_index', 0)}"
                self._tel = init_worker(dataclasses.replace(self.spec, role=role))
                wrap(env_runner, "stop", self._closing)
            else:
                self._tel = driver
            wrap(env_runner, "sample", lambda sample: self._timed_sample(env_runner, sample))
        wrap(env, "step", lambda step: timed(self._tel, "env_step", step))

    def _timed_sample(self, env_runner: Any, sample):
        modules: list[Any] = []

        def wrapped(*args: Any, **kwargs: Any):
            module = getattr(env_runner, "module", None)  # built after the environment; replaced on restore
            if module is not None and not any(m is module for m in modules):
                modules.append(module)
                for name in ("forward_exploration", "forward_inference"):
                    wrap(module, name, lambda forward: timed(self._tel, "policy_inference", forward))
            undo = self._time_sampling_parts(env_runner)
            try:
                with self._tel.iteration(self._samples, timeline=schema.COLLECTOR):
                    result = sample(*args, **kwargs)
            finally:
                undo()
            self._samples += 1
            return result

        return wrapped

    def _time_sampling_parts(self, env_runner: Any) -> Callable[[], None]:
        """Time the connectors and the episode bookkeeping for one ``sample()`` call; returns what undoes it.

        Set for the call only: outside it (checkpoints, state syncs) the env runner
        holds its own pipelines and methods.
        """
        undo = [wrap(env_runner, name, lambda method: timed(self._tel, "episode_bookkeeping", method)) for name in _BOOKKEEPING if hasattr(env_runner, name)]
        for attribute, phase in _CONNECTORS.items():
            pipeline = getattr(env_runner, attribute, None)
            if pipeline is not None:
                setattr(env_runner, attribute, _TimedPipeline(pipeline, self._tel.phase(phase, schema.COLLECTOR)))
                undo.append(lambda attribute=attribute: _untime_pipeline(env_runner, attribute))

        def undo_all() -> None:
            for step in undo:
                step()

        return undo_all

    def _closing(self, stop):
        def wrapped(*args: Any, **kwargs: Any):
            try:
                return stop(*args, **kwargs)
            finally:
                self._tel.close()

        return wrapped


_ON_POLICY = frozenset({"PPO", "APPO", "IMPALA"})

_CONNECTORS = {"_env_to_module": "env_to_module", "_module_to_env": "module_to_env"}
"""The env runner's connector pipelines, by attribute, and the phase each call is."""
_BOOKKEEPING = ("_make_on_episode_callback", "_increase_sampled_metrics")
"""The env runner's per-step episode callbacks and its per-sample counters: ``episode_bookkeeping``."""


class _TimedPipeline:
    """A connector pipeline whose calls are recorded as a phase; every other attribute is the pipeline's own."""

    __slots__ = ("pipeline", "_recorded")

    def __init__(self, pipeline: Any, recorded: Any) -> None:
        self.pipeline = pipeline
        self._recorded = recorded

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._recorded:
            return self.pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipeline, name)


def _untime_pipeline(env_runner: Any, attribute: str) -> None:
    current = getattr(env_runner, attribute, None)
    if isinstance(current, _TimedPipeline):  # left alone when RLlib replaced it during the call
        setattr(env_runner, attribute, current.pipeline)


def _plain_config(config: Any) -> dict[str, Any]:
    """The algorithm configuration's plain settings (numbers, strings, booleans)."""
    try:
        return plain_settings(config.to_dict())
    except Exception:  # an RLlib whose config cannot say: the run goes without
        return {}


def _ending_run(tel: TrainingTelemetry, stop):
    """``algo.stop()`` ends the run the callbacks opened (``tel.close()`` does too)."""

    def wrapped(*args: Any, **kwargs: Any):
        try:
            return stop(*args, **kwargs)
        finally:
            tel.end_run()

    return wrapped


def _environment_name(config: Any) -> str | None:
    """The environment RLlib was configured with: its registered name, or the class's."""
    env = getattr(config, "env", None)
    return env if isinstance(env, str) else getattr(env, "__name__", None)


def _env_steps(algorithm: Any) -> int | None:
    """Env steps sampled so far, as RLlib counts them (None before the first sample)."""
    try:
        value = algorithm.metrics.peek(("env_runners", "num_env_steps_sampled_lifetime"), default=None)
    except Exception:  # an RLlib without this metric: no step axis, the scalars keep theirs
        return None
    return None if value is None else int(value)


def _flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The finite numeric leaves of a training result, keyed ``a/b/c``."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        if key == "config":
            continue
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, path + "/"))
        elif isinstance(value, Number) and not isinstance(value, bool) and math.isfinite(value):
            out[path] = value  # RLlib reports NaN for a statistic with no data yet: not a value, not an alarm
    return out

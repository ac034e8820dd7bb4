"""skrl: ``otel_rl.integrations.skrl.instrument(trainer, tel)`` before ``trainer.train()``.

For a single-agent trainer (``SequentialTrainer`` and the like) over one skrl
agent (PPO, SAC, TD3, DQN...), it records:

- each environment step of the trainer's loop as a ``collector`` iteration
  (at ``timestep * num_envs`` env steps): ``policy_inference`` (the agent's
  ``act``), ``env_step`` (the wrapped environment's ``step``) and
  ``replay_write`` (``record_transition``);
- each ``update`` of the agent (PPO's after every rollout, SAC's every step)
  as a ``learner`` iteration holding one ``learning`` phase;
- what the agent tracks (``Loss / Policy loss``, ``Reward / Total reward
  (mean)``...) under canonical keys (``otel_rl.formats.schema.LIBRARY_TAGS["skrl"]``),
  as skrl reduces it (min, max or mean: the values it writes, taken as it writes them), every time skrl writes it
  (its ``experiment.write_interval``, ``"auto"`` by default), at that timestep.

skrl's own TensorBoard and W&B writing is left as configured. The methods
are wrapped on the agent's and the environment's instances. When no run is
open, ``trainer.train()`` is the run (with the trainer's timesteps, the
number of environments and the agent's configuration), ended as it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.base.log import logger
from otel_rl.formats import schema
from otel_rl.integrations._wrapping import Cycle, environment_name, opens_run, saves, settings, timed, wrap

SYSTEM = "skrl"
"""``rl.system`` of runs trained with skrl."""

_logger = logger(__name__)


_ON_POLICY = frozenset({"A2C", "AMP", "PPO", "RPO", "TRPO"})
"""skrl's on-policy agents (by class name, ``PPO_RNN`` included)."""


def instrument(trainer: Any, tel: TrainingTelemetry) -> Any:
    """Record ``trainer``'s phases and its agent's tracking data with ``tel``; returns ``trainer``.

    Raises:
        TypeError: a multi-agent trainer or several agents (one agent per trainer is supported).
    """
    agent = trainer.agents
    if isinstance(agent, (list, tuple)) or not hasattr(agent, "record_transition"):
        raise TypeError("otel_rl.integrations.skrl.instrument takes a trainer of one single-agent skrl agent")
    env = trainer.env
    num_envs = int(getattr(env, "num_envs", 1) or 1)
    cycle = Cycle(tel)
    state = {"updates": 0}
    warm_up = getattr(getattr(agent, "cfg", None), "learning_starts", 0) or 0
    warm_up = warm_up if isinstance(warm_up, int) else 0

    def pre_interaction(original):
        def wrapped(*, timestep: int, timesteps: int) -> None:
            original(timestep=timestep, timesteps=timesteps)
            cycle.begin(timestep * num_envs)

        return wrapped

    def record_transition(original):
        recorded = timed(tel, "replay_write", original)

        def wrapped(*args: Any, **kwargs: Any) -> None:
            try:
                recorded(*args, **kwargs)
            finally:
                cycle.end()

        return wrapped

    def update(original):
        learning = tel.phase("learning")

        def wrapped(*, timestep: int, timesteps: int) -> None:
            if state["updates"] == 0 and warm_up:  # the first update after the agent's learning_starts
                tel.event(schema.EVENT_WARMUP_DONE, env_steps=timestep * num_envs, learning_starts=warm_up)
            with tel.iteration(state["updates"], env_steps=timestep * num_envs), learning:
                original(timestep=timestep, timesteps=timesteps)
            state["updates"] += 1

        return wrapped

    def write_tracking_data(original):
        def wrapped(*, timestep: int, timesteps: int) -> None:
            with _written(getattr(agent, "writer", None)) as written:  # the values skrl reduces and writes, taken as it writes them
                original(timestep=timestep, timesteps=timesteps)
            if written:
                tel.scalars(written, step=timestep * num_envs)

        return wrapped

    wrap(agent, "pre_interaction", pre_interaction)
    wrap(agent, "act", lambda act: timed(tel, "policy_inference", act))
    wrap(agent, "record_transition", record_transition)
    wrap(agent, "update", update)
    wrap(agent, "write_tracking_data", write_tracking_data)
    directory = getattr(agent, "experiment_dir", None)
    wrap(agent, "write_checkpoint", lambda write: saves(tel, write, lambda *, timestep, timesteps: {
        "timestep": timestep, **({} if directory is None else {"directory": str(directory)})}))  # fmt: skip
    wrap(env, "step", lambda step: timed(tel, "env_step", step))
    family = "rl.onpolicy" if type(agent).__name__.split("_")[0].upper() in _ON_POLICY else "rl.offpolicy"

    def run_metadata(*args: Any, **kwargs: Any) -> dict[str, Any]:
        timesteps = getattr(getattr(trainer, "cfg", None), "timesteps", None)  # a dataclass in skrl 2, else the trainer's own
        timesteps = getattr(trainer, "timesteps", None) if timesteps is None else timesteps
        return {
            "family": family,
            "total_steps": timesteps * num_envs if isinstance(timesteps, int) else None,
            "num_envs": num_envs,
            "config": {"agent": type(agent).__name__, **settings(getattr(agent, "cfg", None))},
        }

    tel.describe_system(SYSTEM, environment_name(env), type(agent).__name__)
    wrap(trainer, "train", lambda train: opens_run(tel, train, run_metadata))
    if getattr(agent, "write_interval", 1) == 0:
        _logger.warning("otel-rl: the skrl agent's experiment.write_interval is 0: its tracking data is not recorded, only phases")
    return trainer




@contextlib.contextmanager
def _written(writer: Any) -> Iterator[dict[str, float]]:
    """The scalars ``writer.add_scalar`` receives inside the block (skrl's own reduction of each tracked
    series: ``(min)``, ``(max)``, else the mean), under canonical keys; they still reach the writer."""
    written: dict[str, float] = {}
    add = getattr(writer, "add_scalar", None)
    if add is None:
        yield written
        return

    def taken(*args: Any, **kwargs: Any) -> Any:
        tag, value = kwargs.get("tag", args[0] if args else None), kwargs.get("value", args[1] if len(args) > 1 else None)
        if isinstance(tag, str) and value is not None:
            written[schema.library_key("skrl", tag)] = float(value)
        return add(*args, **kwargs)

    own = "add_scalar" in vars(writer)
    writer.add_scalar = taken
    try:
        yield written
    finally:
        if own:
            writer.add_scalar = add
        else:
            del writer.add_scalar

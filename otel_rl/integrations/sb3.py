"""Stable-Baselines3: ``model.learn(..., callback=TelemetryCallback(tel))``.

The callback records, for on-policy (PPO, A2C) and off-policy (SAC, TD3,
DQN) algorithms alike:

- each rollout as a ``collector`` iteration (at the env-step count it started
  at), with ``env_step`` (the vectorised environment's ``step``) and
  ``policy_inference`` (the policy choosing actions) as its phases;
- each call of the algorithm's ``train()`` as a ``learner`` iteration holding
  one ``learning`` phase;
- everything SB3 logs (``train/value_loss``, ``rollout/ep_rew_mean``...)
  under canonical keys (``Loss/value``, ``Train/mean_reward``...; the table is
  ``otel_rl.formats.schema.LIBRARY_TAGS["sb3"]``) at SB3's step (``num_timesteps``),
  through an SB3 logger output added to the model's logger;
- the episodes ended in each rollout as ``Episode/timeout_rate`` (the time
  limit's share: Gymnasium's ``truncated``) and ``Episode/terminated_rate``;
- every ``model.save`` (``CheckpointCallback``'s too) as a ``checkpoint_saved``
  event with its path, and an off-policy model's first update (after
  ``learning_starts``) as ``warmup_done``.

The environment, policy and ``train`` are wrapped on the model's instances
for the duration of ``learn()`` and restored at its end. When no run is open
(no ``tel.run()`` around ``learn()``), ``learn()`` is the run: opened with
the model's hyperparameters, total timesteps and number of environments,
finished when ``learn()`` returns (a ``learn()`` that raises leaves it open
for ``tel.close()``, or the exit, to end as failed).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from otel_rl.api import TrainingTelemetry
from otel_rl.base import extras

extras.require(extras.INTEGRATIONS["sb3"])  # an error naming the extra, before the library's own import fails

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter

from otel_rl.base import compat
from otel_rl.formats import schema
from otel_rl.integrations._wrapping import Cycle, environment_name, path_argument, plain_settings, saves, time_forward, timed, wrap

SYSTEM = "stable_baselines3"
"""``rl.system`` of runs trained with SB3."""


_CHANGING = frozenset({"num_timesteps", "verbose", "start_time"})
"""Model attributes that are state, not configuration."""


_WRAPPED = ("train", "predict", "save")
"""The model's methods this callback wraps on the instance while ``learn()`` runs."""


def _leaving_out_wrappers(save: Any) -> Any:
    """``model.save`` without the wrappers set on the instance: they time this process's calls and are not the model."""

    def call(path: Any, exclude: Any = None, include: Any = None) -> Any:
        return save(path, exclude=[*(exclude or ()), *_WRAPPED], include=include)

    return call


class TelemetryOutput(KVWriter):
    """An SB3 logger output that records every numeric value as a scalar under its canonical key."""

    def __init__(self, tel: TrainingTelemetry) -> None:
        self.tel = tel

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        values = {
            schema.library_key("sb3", key): value
            for key, value in key_values.items()
            if isinstance(value, numbers.Number) or _is_scalar_tensor(value)
        }
        if values:
            self.tel.scalars(values, step=step)

    def close(self) -> None:
        """The telemetry outlives SB3's logger: nothing to close."""


def _is_scalar_tensor(value: Any) -> bool:
    return getattr(value, "ndim", None) == 0 and type(value).__module__.startswith(("torch", "numpy"))


class TelemetryCallback(BaseCallback):
    """Phases, iterations and SB3's own metrics for ``model.learn`` (see the module docstring)."""

    def __init__(self, tel: TrainingTelemetry, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.tel = tel
        self._output = TelemetryOutput(tel)
        self._rollout = Cycle(tel)
        self._updates = 0
        self._restore: list[Any] = []
        self._formats: list[Any] = []  # the output formats of the logger this callback writes into
        self._opened_run = False
        self._warming = False
        self._ended = [0, 0]  # episodes ended by the time limit, and terminated, since the last rates

    # -- lifecycle -----------------------------------------------------------

    def _on_training_start(self) -> None:
        if self._restore:  # the previous learn() raised: SB3 never ended its training
            self._end_abandoned()
        model = self.model
        on_policy = not compat.sb3_off_policy(model)
        self.tel.describe_system(SYSTEM, environment_name(self.training_env), type(model).__name__)
        self._opened_run = self.tel.start_run(
            family="rl.onpolicy" if on_policy else "rl.offpolicy",
            total_steps=compat.sb3_total_steps(model),
            num_envs=model.n_envs,
            config={"algorithm": type(model).__name__, **plain_settings(vars(model), _CHANGING)},
        )
        self._formats = model.logger.output_formats
        if self._output not in self._formats:
            self._formats.append(self._output)
        self._restore.append(wrap(model, "train", self._timed_train))
        self._restore.append(wrap(model, "save", lambda save: saves(self.tel, _leaving_out_wrappers(save), path_argument)))  # CheckpointCallback's too
        self._warming = not on_policy and (getattr(model, "learning_starts", 0) or 0) > 0
        self._restore.append(wrap(self.training_env, "step", lambda step: timed(self.tel, "env_step", step)))
        collecting = self._collecting  # inference is timed only inside rollouts, not in evaluation
        if compat.sb3_off_policy(model):  # off-policy: actions come from model.predict
            self._restore.append(wrap(model, "predict", lambda predict: timed(self.tel, "policy_inference", predict, when=collecting)))
        else:  # on-policy: from calling the policy module
            self._restore.append(time_forward(self.tel, model.policy, "policy_inference", collecting))

    def _on_training_end(self, error: BaseException | None = None) -> None:
        self._rollout.end()  # learn() stopped by a callback mid-rollout
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()
        if self._output in self._formats:
            self._formats.remove(self._output)
        if self._opened_run:
            self._opened_run = False
            self.tel.end_run(error)

    def _end_abandoned(self) -> None:
        """A learn() that raised left its timers in place and its run open: they go, and the run ends as failed."""
        self._on_training_end(RuntimeError("model.learn() raised before its training ended"))

    # -- the collector's rollouts ------------------------------------------------

    def _collecting(self) -> bool:
        return self._rollout.is_open

    def _on_rollout_start(self) -> None:
        self._rollout.begin(self.model.num_timesteps)

    def _on_rollout_end(self) -> None:
        self._rollout.end()
        self._episode_rates()

    def _on_step(self) -> bool:
        dones = self.locals.get("dones")
        if dones is not None and dones.any():  # episodes ended: by the time limit (Gymnasium's truncated) or terminated
            infos = self.locals.get("infos") or ()
            for index in np.flatnonzero(dones).tolist():
                self._ended[0 if index < len(infos) and infos[index].get("TimeLimit.truncated") else 1] += 1
        return True

    def _episode_rates(self) -> None:
        """``Episode/timeout_rate`` and ``Episode/terminated_rate`` of the episodes ended since the last ones (none before the first)."""
        timeouts, terminated = self._ended
        if timeouts + terminated:
            ended = timeouts + terminated
            self.tel.scalars({"Episode/timeout_rate": timeouts / ended, "Episode/terminated_rate": terminated / ended}, step=self.model.num_timesteps)
            self._ended = [0, 0]

    # -- the learner's updates -----------------------------------------------------

    def _timed_train(self, train):
        tel = self.tel
        learning = tel.phase("learning")

        def timed(*args: Any, **kwargs: Any):
            if self._warming:  # an off-policy model's first update: its learning_starts steps are behind it
                self._warming = False
                tel.event(schema.EVENT_WARMUP_DONE, env_steps=self.model.num_timesteps, learning_starts=self.model.learning_starts)
            with tel.iteration(self._updates, env_steps=self.model.num_timesteps), learning:
                result = train(*args, **kwargs)
            self._updates += 1
            return result

        return timed

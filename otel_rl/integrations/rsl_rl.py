"""RSL-RL (``rsl-rl-lib``, Isaac Lab's trainer): ``instrument(runner, tel)`` before ``runner.learn(...)``.

For an ``OnPolicyRunner`` it records:

- each rollout as a ``collector`` iteration: ``policy_inference`` (the
  algorithm's ``act``), ``env_step`` (the environment's ``step``) and
  ``replay_write`` (``process_env_step``, the rollout storage), ending with
  ``compute_returns``;
- each ``update`` as a ``learner`` iteration holding one ``learning`` phase;
- the episodes each rollout ended as ``Episode/timeout_rate`` (the share the
  environment's ``time_outs`` ended) and ``Episode/terminated_rate``, summed
  on the environment's device and read once per rollout;
- every ``runner.save`` as a ``checkpoint_saved`` event with its path;
- everything the runner's logger writes (losses, ``Perf/*``, rewards, episode
  extras: ``reward/<term>``, ``Episode_Reward/<term>``, ``Episode_Termination/<term>``,
  the rest under ``rslrl/``) under canonical keys
  (``otel_rl.formats.schema.LIBRARY_TAGS["rsl_rl"]``), at the env-step count of the
  iteration (RSL-RL's own step is the iteration number), next to the writer
  the runner was configured with (TensorBoard, W&B, Neptune). Series RSL-RL
  plots against wall seconds (``*/time``) are left to that writer. When
  otel-rl's own W&B output is on, RSL-RL's W&B writer is left out (one W&B
  run, not two; RSL-RL then writes its TensorBoard files);
- the videos its environment records under the log folder (``*.mp4``), each
  once, as otel-rl videos (``video``): kept in the run folder and sent to
  every output.

The logger writes only when the runner has a ``log_dir``; without one only
the phases are recorded (one warning). When no run is open, ``learn()`` is
the run (its env steps, the number of environments and the runner's
configuration), ended as it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.base.log import logger
from otel_rl.formats import schema
from otel_rl.integrations._wrapping import Cycle, environment_name, opens_run, path_argument, saves, settings, timed, wrap

SYSTEM = "rsl_rl"
"""``rl.system`` of runs trained with RSL-RL."""

_logger = logger(__name__)


def _scalars_too(tel: TrainingTelemetry, env_steps_per_iteration: int) -> Any:
    """A wrapper of the runner's writer's ``add_scalar``: every scalar also becomes a scalar of ``tel``.

    The writer keeps its class (RSL-RL uploads its configuration, checkpoints and videos only to a ``LogWriter``).
    """

    def make(original: Any) -> Any:
        def add_scalar(key: str, value: Any, step: int = 0, *args: Any, **kwargs: Any) -> None:
            if not key.endswith("/time"):
                tel.scalars({schema.library_key("rsl_rl", key): value}, step=(int(step) + 1) * env_steps_per_iteration)
            original(key, value, step, *args, **kwargs)

        return add_scalar

    return make


def _wandb_configured(cfg: Any) -> bool:
    """Whether the runner's configuration asks for RSL-RL's W&B writer (the dict form or the old ``"wandb"``)."""
    logger_cfg = cfg.get("logger", "tensorboard") if isinstance(cfg, dict) else None
    name = logger_cfg if isinstance(logger_cfg, str) else logger_cfg.get("class_name") if isinstance(logger_cfg, dict) else None
    return name in ("wandb", "WandbLogWriter") or (isinstance(name, str) and name.endswith(".WandbLogWriter"))


def instrument(runner: Any, tel: TrainingTelemetry) -> Any:
    """Record ``runner``'s phases and logged metrics with ``tel``; returns ``runner``."""
    alg, env, log = runner.alg, runner.env, runner.logger
    steps_per_rollout = int(runner.cfg["num_steps_per_env"]) * int(env.num_envs)
    rollout = Cycle(tel)
    state = {"updates": 0}

    def act(original):
        recorded = timed(tel, "policy_inference", original)

        def wrapped(*args: Any, **kwargs: Any):
            rollout.begin(rollout.count * steps_per_rollout)  # the first action of a rollout opens it
            return recorded(*args, **kwargs)

        return wrapped

    def update(original):
        learning = tel.phase("learning")

        def wrapped(*args: Any, **kwargs: Any):
            with tel.iteration(state["updates"], env_steps=rollout.count * steps_per_rollout), learning:
                result = original(*args, **kwargs)
            state["updates"] += 1
            return result

        return wrapped

    def init_logging_writer(original):
        def wrapped(*args: Any, **kwargs: Any):
            cfg = getattr(log, "cfg", None)
            takeover = bool(getattr(getattr(tel, "config", None), "wandb", False)) and _wandb_configured(cfg)
            if takeover:  # one W&B run, otel-rl's: RSL-RL writes its TensorBoard files only
                had, configured = "logger" in cfg, cfg.get("logger")
                cfg["logger"] = "tensorboard"
            try:
                original(*args, **kwargs)
            finally:
                if takeover:
                    if had:
                        cfg["logger"] = configured
                    else:
                        cfg.pop("logger", None)
            if takeover:
                _logger.warning("otel-rl: RSL-RL's W&B writer is left out for otel-rl's W&B run (one run, not two): it gets every "
                                "scalar, the configuration and the videos; RSL-RL still writes its TensorBoard files")  # fmt: skip
            if log.writer is None:
                _logger.warning("otel-rl: the RSL-RL runner has no log_dir, so its logger writes nothing; only phases are recorded")
            else:
                wrap(log.writer, "add_scalar", _scalars_too(tel, steps_per_rollout))

        return wrapped

    videos: set[str] = set()

    def logged(original):
        def wrapped(*args: Any, **kwargs: Any):
            result = original(*args, **kwargs)
            folder = getattr(log, "log_dir", None)
            if folder is not None and getattr(log, "writer", None) is not None:  # the videos its environment recorded: each once
                for video in sorted(Path(folder).rglob("*.mp4")):
                    if video.name not in videos:
                        videos.add(video.name)
                        tel.video("video", video, step=rollout.count * steps_per_rollout, caption=video.name)
            return result

        return wrapped

    wrap(alg, "act", act)
    ended: dict[str, Any] = {}  # the rollout's ended episodes and time-outs, summed on the envs' device (no host read per step)

    def process_env_step(original):
        recorded = timed(tel, "replay_write", original)

        def wrapped(obs: Any, rewards: Any, dones: Any, extras: Any, *args: Any, **kwargs: Any):
            time_outs = extras.get("time_outs") if isinstance(extras, dict) else None
            if time_outs is not None:
                done = dones.bool()
                ended["episodes"] = ended.get("episodes", 0) + done.sum()
                ended["time_outs"] = ended.get("time_outs", 0) + (time_outs.bool() & done).sum()
            return recorded(obs, rewards, dones, extras, *args, **kwargs)

        return wrapped

    def compute_returns(original):
        def wrapped(*args: Any, **kwargs: Any):
            try:
                return original(*args, **kwargs)
            finally:
                rollout.end()
                if ended:  # the rollout's rates, one host read with its other scalars; none before an episode ended (0/0)
                    episodes, time_outs = ended.pop("episodes").float(), ended.pop("time_outs").float()
                    tel.scalars({"Episode/timeout_rate": time_outs / episodes, "Episode/terminated_rate": 1.0 - time_outs / episodes},
                                step=rollout.count * steps_per_rollout)  # fmt: skip

        return wrapped
    wrap(alg, "process_env_step", process_env_step)
    wrap(alg, "compute_returns", compute_returns)
    wrap(alg, "update", update)
    wrap(env, "step", lambda method: timed(tel, "env_step", method))
    wrap(log, "init_logging_writer", init_logging_writer)
    if callable(getattr(log, "log", None)):
        wrap(log, "log", logged)

    def run_metadata(num_learning_iterations: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {
            "family": "rl.onpolicy",
            "total_steps": int(num_learning_iterations) * steps_per_rollout,
            "num_envs": int(env.num_envs),
            "config": settings(runner.cfg),
        }

    tel.describe_system(SYSTEM, environment_name(env), type(alg).__name__)
    wrap(runner, "learn", lambda learn: opens_run(tel, learn, run_metadata))
    wrap(runner, "save", lambda save: saves(tel, save, path_argument))  # its save_interval's checkpoints and the last
    return runner

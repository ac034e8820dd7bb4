"""TorchRL: a ``Logger`` that writes to otel-rl, and a collector loop timed as both timelines.

Two lines in a TorchRL training script::

    logger = TelemetryLogger(tel)                  # wherever a torchrl Logger goes
    for batch in iterate(collector, tel):          # instead of ``for batch in collector``
        ...                                        # the update: the learner's iteration

- :class:`TelemetryLogger` records ``log_scalar`` / ``log_metrics`` as
  scalars under canonical keys (``loss_objective`` is ``Loss/policy``...; the
  table is ``otel_rl.formats.schema.LIBRARY_TAGS["torchrl"]``), ``log_histogram``
  as a distribution, ``log_hparams`` as a ``hparams`` event.
- :func:`iterate` times each batch the collector gathers as a ``collector``
  iteration (``policy_inference``: the policy's forward; ``env_step``: the
  environment's ``step_and_maybe_reset``) and the loop body that consumes it
  as a ``learner`` iteration holding one ``learning`` phase, at the frame
  count collected so far. When no run is open, the loop is the run: opened
  with the collector's ``total_frames`` and number of environments, ended
  when the loop ends (finished, or failed by what the collector raised).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.base import extras

extras.require(extras.INTEGRATIONS["torchrl"])  # an error naming the extra, before the library's own import fails

from torchrl.record.loggers import Logger

from otel_rl.base.log import logger, once
from otel_rl.formats import schema
from otel_rl.integrations._wrapping import environment_name, plain_settings, time_forward, timed, wrap

SYSTEM = "torchrl"
"""``rl.system`` of runs trained with TorchRL."""

_logger = logger(__name__)


class TelemetryLogger(Logger):
    """A TorchRL logger whose every metric goes to ``tel`` (see the module docstring)."""

    def __init__(self, tel: TrainingTelemetry, exp_name: str = "otel-rl") -> None:
        self.tel = tel
        super().__init__(exp_name=exp_name, log_dir="")

    def _create_experiment(self) -> Any:
        return self.tel

    def log_scalar(self, name: str, value: float, step: int | None = None) -> None:
        self.tel.scalars({schema.library_key("torchrl", name): value}, step=step)

    def log_metrics(self, metrics: Any, step: int | None = None, *, keys_sep: str = "/") -> dict[str, Any]:
        """All the metrics as one record (and one host transfer for their tensors)."""
        if hasattr(metrics, "flatten_keys"):  # a TensorDict
            metrics = metrics.flatten_keys(keys_sep).to_dict()
        self.tel.scalars({schema.library_key("torchrl", str(k)): v for k, v in metrics.items()}, step=step)
        return dict(metrics)

    def log_histogram(self, name: str, data: Sequence, **kwargs: Any) -> None:
        self.tel.distribution(schema.library_key("torchrl", name), data, step=kwargs.get("step"))

    def log_hparams(self, cfg: Any) -> None:
        if hasattr(cfg, "items") and not isinstance(cfg, dict):  # an OmegaConf DictConfig
            cfg = dict(cfg.items())
        self.tel.event("hparams", **{str(k): v for k, v in dict(cfg).items()})

    def log_video(self, name: str, video: Any, step: int | None = None, **kwargs: Any) -> None:
        _logger.warning("otel-rl: TelemetryLogger does not record videos; %r is skipped", name, extra=once(f"video:{name}"))

    def __repr__(self) -> str:
        return f"TelemetryLogger(run_id={getattr(self.tel, 'run_id', None)!r})"


def iterate(collector: Any, tel: TrainingTelemetry) -> Iterator[Any]:
    """The collector's batches, with its rollouts and the loop body timed (see the module docstring)."""
    state = {"collecting": False, "rollouts": 0, "frames": 0}
    undo = []
    if hasattr(collector.policy, "register_forward_pre_hook"):
        undo.append(time_forward(tel, collector.policy, "policy_inference", lambda: state["collecting"]))

    def rollout(original):
        def wrapped(*args: Any, **kwargs: Any):
            with tel.iteration(state["rollouts"], env_steps=state["frames"], timeline=schema.COLLECTOR):
                state["collecting"] = True
                try:
                    return original(*args, **kwargs)
                finally:
                    state["collecting"] = False
                    state["rollouts"] += 1

        return wrapped

    undo.append(wrap(collector, "rollout", rollout))
    undo.append(wrap(collector.env, "step_and_maybe_reset", lambda step: timed(tel, "env_step", step)))
    learning = tel.phase("learning")
    total = getattr(collector, "total_frames", None)
    tel.describe_system(SYSTEM, environment_name(collector.env))
    opened = tel.start_run(
        total_steps=total if isinstance(total, int) and total > 0 else None,
        num_envs=_num_envs(collector.env),
        config={"collector": type(collector).__name__, **plain_settings({name: getattr(collector, name, None) for name in _COLLECTOR_SETTINGS})},
    )
    try:
        for index, batch in enumerate(collector):
            state["frames"] += int(batch.numel())
            with tel.iteration(index, env_steps=state["frames"]), learning:
                yield batch
    except GeneratorExit:  # the loop left early (break), or the collector is done
        raise
    except BaseException as exc:  # from the collector
        if opened:
            opened = False
            tel.end_run(exc)
        raise
    finally:
        for restore in reversed(undo):
            restore()
        if opened:
            tel.end_run()


_COLLECTOR_SETTINGS = ("frames_per_batch", "total_frames", "init_random_frames", "max_frames_per_traj", "reset_at_each_iter",
                       "split_trajs", "exploration_type", "device", "policy_device", "env_device")  # fmt: skip
"""A TorchRL collector's settings a run records (its other attributes are state)."""


def _num_envs(env: Any) -> int | None:
    """The environments a TorchRL env batches (its batch size's product), None when unbatched or unknown."""
    size = getattr(env, "batch_size", None)
    try:
        count = int(size.numel()) if size is not None and len(size) else None
    except (TypeError, AttributeError):
        return None
    return count

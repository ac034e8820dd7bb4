"""TRL's ``GRPOTrainer`` (and ``RLOOTrainer``, which shares its code path): ``instrument(trainer, tel)`` before ``trainer.train()``.

Each optimizer step is a ``learner`` iteration (its index TRL's global step). Inside it:

- ``generation``: the completions (``transformers.generate``, ``vLLM.generate``), with ``weight_publish`` for
  ``sync_weights`` (the policy's weights pushed to vLLM);
- ``reward``: scoring them, each reward function a nested phase named after it (``reward_len``...);
- ``old_log_prob`` and ``ref_log_prob``: the log-prob passes of the old policy (``num_iterations > 1``, vLLM's
  importance sampling) and of the reference model (``beta > 0``);
- ``learning``: once per micro-batch, its loss and backward pass (``compute_loss``, ``backward``, nested); the
  last micro-batch's goes on through gradient clipping and the optimizer step (``optimizer``, nested), so a step
  without gradient accumulation has one learning phase.

TRL generates a whole generation batch at once, every ``steps_per_generation * num_iterations`` steps, so the steps
in between hold only their learning: that is how TRL spends its time. The phases come from TRL's own timers
(``trl.extras.profiling.profiling_context``, seen for this trainer only) and from the trainer's methods, wrapped on
the instance.

What TRL logs (its ``on_log``: the merged dict, GRPO's averaged metrics included) becomes scalars at TRL's global
step, under canonical keys (``otel_rl.formats.schema.LIBRARY_TAGS["trl"]``: ``loss`` is ``Loss/policy``, ``reward``
is ``Train/mean_reward``, ``kl`` is ``Policy/approx_kl``...; the rest under ``trl/``). Each generation's prompt and
completion tokens are ``Train/prompt_tokens`` and ``Train/completion_tokens``, and the step's tokens per second
``Perf/tokens_per_s``.

Where otel-rl's panel draws, transformers' progress bar and printed logs are left out (said once): they would be
written between the panel's frames. TRL's own ``report_to`` goes on as configured. When otel-rl's W&B output is on and TRL reports to W&B too, TRL's
W&B callback is left out (one W&B run, otel-rl's, with every scalar; said once). When no run is open, ``train()`` is
the run (the trainer's configuration, its algorithm), ended as it ends: a reward function that raises ends it
``failed`` with its reason.
"""

from __future__ import annotations

import math
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.base import extras
from otel_rl.base.log import logger

extras.require(extras.INTEGRATIONS["trl"])  # an error naming the extra, before the library's own import fails

from transformers import TrainerCallback
from trl import GRPOTrainer

from otel_rl.formats import schema
from otel_rl.integrations._wrapping import opens_run, plain_settings, wrap

SYSTEM = "trl"
"""``rl.system`` of runs trained with TRL."""

GENERATE = frozenset({"transformers.generate", "transformers.generate_batch", "vLLM.generate"})
"""TRL's timers around generating completions."""
SYNC_WEIGHTS = "sync_weights"

_logger = logger(__name__)
_instrumented: weakref.WeakKeyDictionary[Any, _Steps] = weakref.WeakKeyDictionary()
_patch_lock = threading.Lock()
_PHASE_NAME = re.compile(r"[^a-z0-9_]+")


def phase_of_reward(name: str) -> str:
    """A reward function's phase: its name in snake case (``reward_len``), ``reward_`` before one that is not a name."""
    cleaned = _PHASE_NAME.sub("_", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()).strip("_")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = "reward_" + cleaned
    return cleaned[:63]


class _Steps:
    """One trainer's phases: where each of TRL's timers and methods goes."""

    def __init__(self, trainer: Any, tel: TrainingTelemetry) -> None:
        self._trainer = weakref.ref(trainer)  # the registry's value must not hold its key: a trainer let go is freed
        self.tel = tel
        self.learning: ExitStack | None = None
        self.in_reward = False
        self.in_loss = False
        self.step: Any = None
        self.old_done = False
        self.learned = False
        """The open learning phase ran a backward pass: it stays open through clipping and the optimizer step."""
        self.batch: tuple[float, int] | None = None
        """When the latest generation began, and the tokens it made: its steps' throughput once the next one begins."""

    def throughput(self, now: float) -> None:
        """The latest generation batch's tokens over the time its steps took (from it to the next one, or the end)."""
        batch, self.batch = self.batch, None
        trainer = self._trainer()
        if trainer is not None and batch is not None and batch[1] and now > batch[0]:
            self.tel.scalars({schema.TOKENS_PER_S: batch[1] / (now - batch[0])}, step=int(trainer.state.global_step))

    # -- TRL's own timers ------------------------------------------------

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """What TRL times as ``name`` as a phase, or nothing where a method wrapped here is its phase already."""
        phase = None
        if name in GENERATE:
            phase = self.tel.phase("generation")
            self.old_done = False
        elif name == SYNC_WEIGHTS:
            phase = self.tel.phase("weight_publish")
        elif self.in_reward and not name.startswith("_"):  # a reward function, inside _calculate_rewards
            phase = self.tel.phase(phase_of_reward(name))
        if phase is None:
            yield
        else:
            with phase:
                yield


def _profiling_context(original: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """TRL's ``profiling_context`` for every trainer, and a phase as well for an instrumented one."""

    def profiling_context(trainer: Any, name: str) -> Any:
        context = original(trainer, name)
        steps = _instrumented.get(trainer)
        if steps is None:
            return context
        return _Both(context, steps.timer(name))

    profiling_context.__otel_rl_original__ = original  # type: ignore[attr-defined]
    return profiling_context


class _Both:
    """TRL's timer and the phase, entered and left together."""

    def __init__(self, theirs: Any, ours: Any) -> None:
        self._theirs, self._ours, self._stack = theirs, ours, ExitStack()

    def __enter__(self) -> Any:
        entered = self._stack.enter_context(self._theirs)
        self._stack.enter_context(self._ours)
        return entered

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._stack.__exit__(*exc))


def _patch_timers() -> None:
    """Give TRL's modules that time with ``profiling_context`` the wrapper above (once; it passes other trainers through)."""
    import importlib

    with _patch_lock:
        for module_name in ("trl.extras.profiling", "trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            current = getattr(module, "profiling_context", None)
            if current is not None and not hasattr(current, "__otel_rl_original__"):
                module.profiling_context = _profiling_context(current)


class _StepCallback(TrainerCallback):
    """The optimizer step as the learner iteration, the optimizer as its last learning, and TRL's logs as scalars."""

    def __init__(self, steps: _Steps) -> None:
        self.steps = steps
        self.last_tokens: float | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        steps = self.steps
        if steps.step is None:
            steps.step = steps.tel.iteration(int(state.global_step))
            steps.step.__enter__()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        steps = self.steps
        if steps.learning is None:  # the last micro-batch's learning (its loss and backward pass) goes on into the optimizer
            steps.learning = ExitStack()
            steps.learning.enter_context(steps.tel.phase("learning"))
        steps.learning.enter_context(steps.tel.phase("optimizer"))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _close_learning(self.steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        steps = self.steps
        _close_learning(steps)
        step, steps.step = steps.step, None
        if step is not None:
            step.__exit__(None, None, None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.throughput(time.perf_counter())

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        # TRL logs a mean of nothing but NaN as None (a reward function that returned NaN): recorded as NaN, which is
        # said (a ``nonfinite`` event, one warning) rather than left out.
        values = {
            schema.library_key("trl", key): math.nan if value is None else value
            for key, value in logs.items()
            if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        }
        if values:
            self.steps.tel.scalars(values, step=int(state.global_step))


def _close_learning(steps: _Steps) -> None:
    learning, steps.learning, steps.learned = steps.learning, None, False
    if learning is not None:
        learning.close()


def _count_tokens(lists: Any) -> int:
    try:
        return sum(len(ids) for ids in lists)
    except TypeError:
        return 0


def instrument(trainer: Any, tel: TrainingTelemetry) -> Any:
    """Record ``trainer``'s steps, phases and logs with ``tel``; returns ``trainer``."""
    steps = _Steps(trainer, tel)
    _instrumented[trainer] = steps
    _patch_timers()

    def generate(original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            steps.throughput(began)
            result = original(*args, **kwargs)
            if isinstance(result, tuple) and len(result) >= 2:  # prompt ids, completion ids, ...
                prompt, completion = _count_tokens(result[0]), _count_tokens(result[1])
                steps.batch = (began, prompt + completion)
                step = int(trainer.state.global_step) + 1  # the step being made, as TRL logs it
                tel.scalars({"Train/prompt_tokens": prompt, "Train/completion_tokens": completion}, step=step)
            return result

        return wrapped

    def rewards(original: Any) -> Any:
        phase = tel.phase("reward")

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            steps.in_reward = True
            try:
                with phase:
                    return original(*args, **kwargs)
            finally:
                steps.in_reward = False

        return wrapped

    def log_probs(original: Any) -> Any:
        old, ref = tel.phase("old_log_prob"), tel.phase("ref_log_prob")
        grpo = isinstance(trainer, GRPOTrainer)

        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            if steps.in_loss:  # the policy's forward for the loss: part of learning
                return original(model, *args, **kwargs)
            # The old policy's pass comes first where TRL makes one (RLOO always; GRPO with several iterations per
            # generation or vLLM's importance sampling); the reference model's is the other (beta > 0), a model or a disabled adapter.
            expects_old = not grpo or getattr(trainer, "num_iterations", 1) > 1 or bool(getattr(trainer, "use_vllm", False))
            is_ref = model is getattr(trainer, "ref_model", None) or not expects_old or steps.old_done
            with ref if is_ref else old:
                result = original(model, *args, **kwargs)
            steps.old_done = not is_ref
            return result

        return wrapped

    def compute_loss(original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _close_learning(steps)
            steps.learning = ExitStack()
            steps.learning.enter_context(tel.phase("learning"))  # left open for the backward pass
            steps.in_loss = True
            try:
                with tel.phase("compute_loss"):
                    return original(*args, **kwargs)
            except BaseException:
                _close_learning(steps)
                raise
            finally:
                steps.in_loss = False

        return wrapped

    def backward(original: Any) -> Any:
        phase = tel.phase("backward")

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                with phase:
                    result = original(*args, **kwargs)
            except BaseException:
                _close_learning(steps)
                raise
            steps.learned = steps.learning is not None  # learning goes on: the step's end, or its optimizer, closes it
            return result

        return wrapped

    def training_step(original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _close_learning(steps)  # a micro-batch of its own: what comes before its loss (a generation) is no learning
            ok = False
            try:
                result = original(*args, **kwargs)
                ok = True
                return result
            finally:
                if not (ok and steps.learned):
                    _close_learning(steps)  # a step without a backward pass (nothing to learn from), or one that raised

        return wrapped

    def metadata(*args: Any, **kwargs: Any) -> dict[str, Any]:
        config = plain_settings(trainer.args.to_dict()) if hasattr(trainer.args, "to_dict") else {}
        return {"family": "rl.onpolicy", "config": config}

    def train(original: Any) -> Any:
        run = opens_run(tel, original, metadata)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tel.describe_system(SYSTEM, algorithm=type(trainer).__name__.removesuffix("Trainer").lower())
            try:
                return run(*args, **kwargs)
            finally:
                _close_learning(steps)
                step, steps.step = steps.step, None
                if step is not None:  # a step that raised
                    step.__exit__(None, None, None)

        return wrapped

    _take_over_wandb(trainer, tel)
    _leave_out_progress(trainer, tel)
    wrap(trainer, "_generate", generate)
    wrap(trainer, "_calculate_rewards", rewards)
    wrap(trainer, "_get_per_token_logps_and_entropies", log_probs)
    wrap(trainer, "compute_loss", compute_loss)
    wrap(trainer, "training_step", training_step)
    wrap(trainer.accelerator, "backward", backward)
    wrap(trainer, "train", train)
    while any(isinstance(c, _StepCallback) for c in trainer.callback_handler.callbacks):  # instrumented again: one callback
        trainer.remove_callback(_StepCallback)
    trainer.add_callback(_StepCallback(steps))
    return trainer


def _leave_out_progress(trainer: Any, tel: TrainingTelemetry) -> None:
    """With otel-rl's panel drawing, transformers' progress bar and printed logs are left out: written between two of
    its frames, each leaves a stacked partial frame on the terminal; the panel shows the step and every value."""
    if not bool(getattr(getattr(tel, "config", None), "panel", False)):
        return
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    handler = getattr(trainer, "callback_handler", None)
    left_out = False
    for kind in (ProgressCallback, PrinterCallback):
        if handler is not None and any(isinstance(c, kind) for c in handler.callbacks):
            trainer.remove_callback(kind)
            left_out = True
    if left_out:
        _logger.warning("otel-rl: transformers' progress bar is left out while otel-rl's panel draws (panel=False brings it back)")


def _take_over_wandb(trainer: Any, tel: TrainingTelemetry) -> None:
    """With otel-rl's W&B output on, TRL's W&B callback is left out: one W&B run, otel-rl's."""
    if not bool(getattr(getattr(tel, "config", None), "wandb", False)):
        return
    from transformers.integrations import WandbCallback

    handler = getattr(trainer, "callback_handler", None)
    if handler is not None and any(isinstance(c, WandbCallback) for c in handler.callbacks):
        trainer.remove_callback(WandbCallback)
        report_to = getattr(trainer.args, "report_to", None)
        if isinstance(report_to, list) and "wandb" in report_to:
            report_to.remove("wandb")  # TRL's timers log to W&B where report_to names it
        _logger.warning("otel-rl: TRL's W&B callback is left out for otel-rl's W&B run (one run, not two): it gets every scalar")

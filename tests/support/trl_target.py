"""TRL's GRPO on the tiny model of ``examples/trl_grpo.py``, instrumented, as a test asks.

    python trl_target.py RUN_DIR STEPS MODE

MODE ``plain``: the example's settings; ``raise``: a second reward function raises at the third step; ``trl-wandb``:
TRL reports to W&B (offline) while otel-rl does not; ``both-wandb``: both ask for W&B; ``rloo``: RLOOTrainer. Under ``accelerate launch``
each process is a rank of one run (the run folder given). ``nan``: the reward function returns NaN; ``three``: three trainers
trained one after another with one ``tel``, each let go after (it prints how many of them are still alive);
``slow-judge``: the reward is a judge that takes 0.8 s a call.
"""

from __future__ import annotations

import sys

from locations import REPO

sys.path.insert(0, str(REPO / "examples"))

import trl_grpo  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.integrations.trl import instrument  # noqa: E402

run_dir, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = {"n": 0}


def judge(completions, **kwargs):
    """A reward function that fails at its third call (a judge that went away)."""
    calls["n"] += 1
    if calls["n"] == 3:
        raise ConnectionError("the reward judge at http://judge:8000 is unreachable")
    return [0.5] * len(completions)


def slow_judge(completions, **kwargs):
    """A reward judge that takes 0.8 s a call (a model served elsewhere): scoring sets the pace."""
    import time

    time.sleep(0.8)
    return [0.5] * len(completions)


def collapsed(completions, **kwargs):
    """A reward that collapsed: NaN for every completion."""
    return [float("nan")] * len(completions)


rewards = {"raise": [trl_grpo.reward_len, judge], "nan": [collapsed], "slow-judge": [slow_judge]}.get(mode)
report_to = ["wandb"] if mode in ("trl-wandb", "both-wandb") else []
if mode == "rloo":  # RLOOTrainer, which shares GRPO's code path
    import tempfile
    from pathlib import Path

    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    model_dir = Path(tempfile.mkdtemp(prefix="tiny-gpt2-"))
    trl_grpo.policy().save_pretrained(model_dir)
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i + j) % 60}" for j in range(4)) for i in range(64)]})
    args = RLOOConfig(output_dir=f"{run_dir}/trl", use_cpu=True, report_to=[], max_steps=steps, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, beta=0.04, logging_steps=1, save_strategy="no")  # fmt: skip
    trainer = RLOOTrainer(model=str(model_dir), processing_class=trl_grpo.tokenizer(), reward_funcs=[trl_grpo.reward_len], args=args, train_dataset=prompts)
else:
    trainer = trl_grpo.trainer(f"{run_dir}/trl", steps, rewards, report_to=report_to, num_iterations=1 if mode in ("raise", "slow-judge") else 2)
tel = otel_rl.init(run_dir=run_dir, algorithm="grpo", wandb=mode == "both-wandb", system_metrics_interval_s=0)
if mode == "plain":
    instrument(trainer, tel)  # set up twice (a notebook cell run again): each step is still recorded once
instrument(trainer, tel)
if mode == "three":
    import gc
    import weakref

    alive = [weakref.ref(trainer)]
    trainer.train()
    del trainer
    for _ in range(2):
        second = trl_grpo.trainer(f"{run_dir}/trl", steps)
        alive.append(weakref.ref(second))
        instrument(second, tel)
        second.train()
        del second
    gc.collect()
    tel.close()
    print("alive:", sum(ref() is not None for ref in alive))
    sys.exit(0)
try:
    trainer.train()
finally:
    tel.close()

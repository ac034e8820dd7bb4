"""TRL's GRPO on the CPU with otel-rl, a tiny model built here (nothing downloaded): ``python examples/trl_grpo.py``.

Needs ``pip install 'otel-rl[trl]'``. Writes ``runs/trl-grpo/``; then ``otel-rl analyze runs/trl-grpo`` says where
each step's time goes (generation, reward scoring, the log-prob passes, learning) and which sets its pace.
"""

import tempfile
from pathlib import Path

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

import otel_rl
from otel_rl.integrations.trl import instrument

WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(60)]


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer of :data:`WORDS`, padding on the left as generation needs."""
    model = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def policy() -> GPT2LMHeadModel:
    """A GPT-2 of two layers over :data:`WORDS`, from its configuration."""
    config = GPT2Config(vocab_size=len(WORDS), n_positions=64, n_embd=32, n_layer=2, n_head=2, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return GPT2LMHeadModel(config)


def reward_len(completions, **kwargs):
    """Longer completions score higher (up to the limit)."""
    return [float(len(completion.split())) for completion in completions]


def trainer(output_dir: str, max_steps: int = 12, reward_funcs: list | None = None, **options) -> GRPOTrainer:
    """A GRPO trainer of :func:`policy` on prompts of :data:`WORDS` (``options``: more of ``GRPOConfig``'s)."""
    # Saved to a folder of its own: with beta > 0 TRL loads the reference model from where the policy came from.
    model_dir = Path(tempfile.mkdtemp(prefix="tiny-gpt2-"))
    policy().save_pretrained(model_dir)
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i + j) % 60}" for j in range(4)) for i in range(64)]})
    settings = dict(use_cpu=True, report_to=[], per_device_train_batch_size=8, num_generations=4, max_completion_length=8, beta=0.04,
                    num_iterations=2, logging_steps=1, save_strategy="no")  # fmt: skip
    args = GRPOConfig(output_dir=output_dir, max_steps=max_steps, **{**settings, **options})
    return GRPOTrainer(model=str(model_dir), processing_class=tokenizer(), reward_funcs=reward_funcs or [reward_len], args=args, train_dataset=prompts)


def main(run_dir: str = "runs/trl-grpo", max_steps: int = 12) -> None:
    grpo = trainer(f"{run_dir}/trl", max_steps)
    tel = otel_rl.init(run_dir=run_dir, algorithm="grpo")
    instrument(grpo, tel)
    grpo.train()  # the run: opened and ended with it
    tel.close()


if __name__ == "__main__":
    main()

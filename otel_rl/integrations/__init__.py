"""Drop-in integrations for RL libraries; each module imports its library only when used.

- :mod:`otel_rl.integrations.sb3`: Stable-Baselines3 (a callback and a logger output).
- :mod:`otel_rl.integrations.torchrl`: TorchRL (a ``Logger`` and timed collector iterations).
- :mod:`otel_rl.integrations.rsl_rl`: RSL-RL's ``OnPolicyRunner``.
- :mod:`otel_rl.integrations.skrl`: skrl agents and trainers.
- :mod:`otel_rl.integrations.rllib`: RLlib callbacks that follow the EnvRunner actors.
- :mod:`otel_rl.integrations.trl`: TRL's ``GRPOTrainer`` and ``RLOOTrainer`` (LLM RL): generation, reward scoring,
  the log-prob passes and learning, per optimizer step.
- :mod:`otel_rl.integrations.verl`: verl's steps (LLM RL), from its timers and its ``Tracking``.

What each library logs is mapped into the canonical schema by one table per
library, :data:`otel_rl.formats.schema.LIBRARY_TAGS`.
"""

"""RLlib PPO on CartPole with otel-rl, EnvRunner actors included: ``python examples/rllib_ppo.py``.

Needs ``pip install 'otel-rl[rllib]'``. Writes ``runs/rllib-ppo/``: one trace
with the driver and each EnvRunner as its own process.
"""

import ray
from ray.rllib.algorithms.ppo import PPOConfig

import otel_rl
from otel_rl.integrations.rllib import TelemetryCallbacks

ray.init()
tel = otel_rl.init(run_dir="runs/rllib-ppo", algorithm="ppo")
with tel.run(family="rl.onpolicy"):
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2)
        .callbacks(TelemetryCallbacks.for_run(tel))
    )
    algo = config.build_algo()
    for _ in range(10):
        algo.train()
    algo.stop()
tel.close()
ray.shutdown()

"""Stable-Baselines3 PPO on CartPole with otel-rl: ``python examples/sb3_ppo.py``.

Needs ``pip install 'otel-rl[sb3]'``. Writes ``runs/sb3-ppo/`` (metrics.jsonl,
the Perfetto trace, TensorBoard); ``otel-rl analyze runs/sb3-ppo`` says where
the time went.
"""

from stable_baselines3 import PPO

import otel_rl
from otel_rl.integrations.sb3 import TelemetryCallback

tel = otel_rl.init(run_dir="runs/sb3-ppo", algorithm="ppo", tensorboard=True)
with tel.run(family="rl.onpolicy", config={"env": "CartPole-v1", "n_steps": 1024}):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=1024, device="cpu")
    model.learn(50_000, callback=TelemetryCallback(tel))
tel.close()

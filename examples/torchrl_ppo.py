"""TorchRL PPO on CartPole with otel-rl: ``python examples/torchrl_ppo.py``.

Needs ``pip install 'otel-rl[torchrl]'``. Writes ``runs/torchrl-ppo/``.
"""

import torch
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import otel_rl
from otel_rl.integrations.torchrl import TelemetryLogger, iterate

tel = otel_rl.init(run_dir="runs/torchrl-ppo", algorithm="ppo")
with tel.run(family="rl.onpolicy"):
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    logits = TensorDictModule(MLP(in_features=4, out_features=2, num_cells=[64]), in_keys=["observation"], out_keys=["logits"])
    policy = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True, spec=env.action_spec)
    value = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[64]), in_keys=["observation"])
    loss, advantage = ClipPPOLoss(policy, value, entropy_coeff=0.01), GAE(gamma=0.99, lmbda=0.95, value_network=value)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
    collector = Collector(env, policy, frames_per_batch=1024, total_frames=50 * 1024, auto_register_policy_transforms=False)
    logger = TelemetryLogger(tel)
    frames = 0
    for batch in iterate(collector, tel):  # collection and update, timed as the two timelines
        frames += batch.numel()
        with torch.no_grad():
            advantage(batch)
        for _ in range(4):
            for minibatch in batch.reshape(-1).split(256):
                losses = loss(minibatch)
                optimizer.zero_grad()
                (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
                optimizer.step()
        logger.log_metrics({k: v.detach() for k, v in losses.items() if k.startswith("loss_")}, step=frames)
        logger.log_scalar("reward", batch["next", "reward"].mean(), step=frames)
    collector.shutdown()
tel.close()

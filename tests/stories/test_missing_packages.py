"""A new user without an optional package: a clear error before anything starts, or one output lost and the rest of the run complete.

Packages are hidden from the import system of real processes (``hidden_packages/sitecustomize.py``):
the training script and the agent process it starts, or the agent alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import SUPPORT

HIDDEN = SUPPORT / "hidden_packages"
TRAINING = """
import os, sys, otel_rl
print("pid", os.getpid(), flush=True)
tel = otel_rl.init(run_dir=sys.argv[1], {options})
with tel.run():
    for i in range(40):
        with tel.iteration(i, env_steps=8 * i):
            with tel.phase("learning"):
                pass
        tel.scalars({{"Loss/critic": 0.5 * i}})
tel.close()
print("training returned")
"""


def train(run_dir: Path, options: str, hide: str, in_agent: bool = False, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(PYTHONPATH=str(HIDDEN), OTEL_RL_TEST_HIDE=hide, WANDB_MODE="offline", **(extra_env or {}))
    if in_agent:
        env["OTEL_RL_TEST_HIDE_IN_AGENT"] = "1"
    script = TRAINING.format(options=options)
    return subprocess.run([sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=120, env=env)


def segments(pid: int) -> list[Path]:
    """The segments of process ``pid`` (other processes of this user, another suite's, may have theirs)."""
    root = Path(f"/dev/shm/otel-rl-{os.getuid()}")
    return list(root.glob(f"**/*-{pid}-*.seg")) if root.exists() else []


@pytest.mark.parametrize(("option", "extra"), [("tensorboard=True", "tensorboard"), ("wandb=True", "wandb"), ("trackio=True", "trackio"), ("swanlab=True", "swanlab")])
def test_an_output_whose_package_is_missing_is_refused_by_init_naming_the_extra(tmp_path, option, extra):
    result = train(tmp_path / "run", option, extra)
    assert result.returncode == 1
    assert f"{option} needs the {extra} package: pip install 'otel-rl[{extra}]'" in result.stderr
    assert "training returned" not in result.stdout
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_an_output_the_agent_cannot_build_costs_only_that_output(tmp_path):
    result = train(tmp_path / "run", "tensorboard=True", "tensorboard", in_agent=True)
    assert result.returncode == 0 and "training returned" in result.stdout, result.stderr
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert sum(1 for r in lines if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 40
    assert json.loads((run / "run_summary.json").read_text())["status"] == "finished"
    assert (run / "trace.perfetto-trace").stat().st_size > 0 and (run / "run_config.json").exists()
    assert not (run / "tensorboard").exists()
    warnings = [line for line in result.stderr.splitlines() if "TensorBoard could not start" in line]
    assert len(warnings) == 1 and "pip install 'otel-rl[tensorboard]'" in warnings[0]
    assert "Traceback" not in result.stderr
    end = result.stderr.strip().splitlines()[-1]
    assert "finished" in end and "without TensorBoard" in end and "trace.perfetto-trace" in end
    pid = int(result.stdout.split()[1])
    assert not segments(pid)  # the segment went with the run


def test_an_environment_setting_whose_package_is_missing_is_ignored_with_one_warning(tmp_path):
    result = train(tmp_path / "run", "quiet=False", "tensorboard", extra_env={"OTEL_RL_TENSORBOARD": "1"})
    assert result.returncode == 0 and "training returned" in result.stdout, result.stderr
    ignored = [line for line in result.stderr.splitlines() if "OTEL_RL_TENSORBOARD=1 is ignored here" in line]
    assert len(ignored) == 1 and "pip install 'otel-rl[tensorboard]'" in ignored[0]
    assert (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.parametrize(
    ("args", "hidden", "says"),
    [
        (("serve", "--port", "0"), "aiohttp", "otel-rl: otel-rl serve needs the aiohttp package: pip install 'otel-rl[serve]'"),
        (("analyze", "RUN", "--plot", "PLOT"), "matplotlib",
         "otel-rl: otel-rl analyze --plot needs the matplotlib package: pip install 'otel-rl[analysis]'"),
        (("export", "RUN"), "pandas", "otel-rl: reading runs into DataFrames (otel_rl.read, otel-rl export) needs the pandas package: pip install 'otel-rl[read]'"),
        (("demo", "--seconds", "1"), "torch", "otel-rl: otel-rl demo needs the torch package: pip install 'otel-rl[demo]'"),
        (("demo", "--seconds", "1"), "gymnasium", "otel-rl: otel-rl demo needs the gymnasium package: pip install 'otel-rl[demo]'"),
    ],
)  # fmt: skip
def test_a_subcommand_whose_extra_is_missing_says_so_in_one_line(tmp_path, args, hidden, says):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trace.perfetto-trace").write_bytes(b"")
    named = {"RUN": str(tmp_path / "run"), "PLOT": str(tmp_path / "plot.png")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(PYTHONPATH=str(HIDDEN), OTEL_RL_TEST_HIDE=hidden)
    command = [sys.executable, "-m", "otel_rl.cli", *[named.get(a, a) for a in args]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [says]


def test_the_notebook_api_without_pandas_names_its_extra(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(PYTHONPATH=str(HIDDEN), OTEL_RL_TEST_HIDE="pandas")
    result = subprocess.run([sys.executable, "-c", "import otel_rl.read"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1 and "reading runs into DataFrames (otel_rl.read, otel-rl export) needs the pandas package: pip install 'otel-rl[read]'" in result.stderr


@pytest.mark.parametrize(
    ("module", "hidden", "says"),
    [
        ("sb3", "stable_baselines3", "otel_rl.integrations.sb3 (Stable-Baselines3) needs the stable_baselines3 package: pip install 'otel-rl[sb3]'"),
        ("torchrl", "torchrl", "otel_rl.integrations.torchrl (TorchRL) needs the torchrl package: pip install 'otel-rl[torchrl]'"),
        ("rllib", "ray", "otel_rl.integrations.rllib (RLlib) needs the ray.rllib package: pip install 'otel-rl[rllib]'"),
        ("trl", "trl", "otel_rl.integrations.trl (TRL) needs the trl package: pip install 'otel-rl[trl]'"),
        ("verl", "verl", "otel_rl.integrations.verl (verl) needs the verl package: pip install 'otel-rl[verl]'"),
    ],
)  # fmt: skip
def test_an_integration_without_its_library_names_its_extra(module, hidden, says):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(PYTHONPATH=str(HIDDEN), OTEL_RL_TEST_HIDE=hidden)
    script = f"import otel_rl.integrations.{module}"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"otel_rl.base.extras.MissingExtra: {says}"
    assert "ModuleNotFoundError" not in result.stderr


def test_a_video_without_its_encoder_is_one_line_naming_the_extra_and_the_run_goes_on(tmp_path):
    script = (
        "import sys, numpy as np, otel_rl\n"
        "tel = otel_rl.init(run_dir=sys.argv[1], panel=False)\n"
        "with tel.run():\n"
        "    for i in range(3):\n"
        "        with tel.iteration(i, env_steps=i):\n"
        "            pass\n"
        "        tel.video('Media/play', np.zeros((4, 8, 8, 3), np.uint8))\n"
        "    tel.scalars({'Loss/critic': 1.0})\n"
        "tel.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(PYTHONPATH=str(HIDDEN), OTEL_RL_TEST_HIDE="imageio_ffmpeg")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "imageio_ffmpeg" in line]
    assert said == ["otel-rl: video('Media/play') ignored: tel.video() of frames needs the imageio_ffmpeg package: pip install 'otel-rl[media]'"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "scalars" and "Loss/critic" in r["values"] for r in records) and records[-1]["status"] == "finished"

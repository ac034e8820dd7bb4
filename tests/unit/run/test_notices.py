"""The start and end lines a run says on standard error."""

from __future__ import annotations

import otel_rl


def test_the_end_line_gives_the_env_steps_and_the_start_line_names_the_wandb_run(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tel = otel_rl.init(run_dir=tmp_path / "exp", wandb=True, wandb_project="sweeps", system_metrics_interval_s=0)
    with tel.run():
        for i in range(5):
            with tel.iteration(i, env_steps=4096 * (i + 1)):
                pass
    tel.close()
    said = capfd.readouterr().err
    assert "wandb/: W&B project 'sweeps', run 'exp', offline" in said
    assert "run exp finished after " in said and " s and 20,480 env steps: " in said


def test_a_loop_without_env_steps_ends_without_them(tmp_path, capfd):
    tel = otel_rl.init(run_dir=tmp_path / "exp", system_metrics_interval_s=0)
    with tel.run():
        with tel.iteration(0):
            pass
    tel.close()
    (end,) = [line for line in capfd.readouterr().err.splitlines() if "finished after" in line]
    assert "env steps" not in end

"""The README's pictures of the web page, taken from real runs: ``python docs/screenshots.py``.

Three real runs of different learning costs stream to a real server (their
traces and diagnoses follow when they end), then headless Chromium
(``chromium-headless-shell``) opens the runs page with summary columns, a
run page with its diagnosis, and the three compared, and saves each as
``docs/images/web-*.png``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))

from browser import Browser  # noqa: E402

from otel_rl.readers.server import IngestServer  # noqa: E402

IMAGES = Path(__file__).parent / "images"
RUN = textwrap.dedent("""
    import math, sys, time
    import otel_rl

    url, run_id, learning_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    tel = otel_rl.init(run_dir=sys.argv[4], run_id=run_id, motrix_url=url, project="pendulum", group="sac-sweep",
                       system_metrics_interval_s=0, quiet=True)
    with tel.run(total_steps=2400, num_envs=8, config={"lr": 3e-4, "updates_per_step": int(learning_ms), "batch_size": 256}):
        for i in range(300):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("collector_wait"):
                    time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(learning_ms / 1000)
            tel.scalars({"Loss/critic": 2.0 / (1 + i / 40) + 0.05 * math.sin(i), "Train/mean_reward": -1400 + 4 * i + 40 * math.sin(i / 9)})
    tel.close()
""")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder, IngestServer(str(Path(folder) / "runs.sqlite3")) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_"))}
        runs = {"sac-ups-1": 2, "sac-ups-2": 4, "sac-ups-4": 8}
        processes = [subprocess.Popen([sys.executable, "-c", RUN, server.url, run_id, str(ms), str(Path(folder) / run_id)], env=env)
                     for run_id, ms in runs.items()]  # fmt: skip
        for process in processes:
            process.wait(300)
        for run_id in runs:  # each run's trace and diagnosis follow it
            while requests.get(f"{server.url}/api/v1/runs/{run_id}/diagnosis", timeout=10).status_code != 200:
                time.sleep(0.2)
        browser = Browser(width=1400, height=900)
        try:
            browser.goto(f"{server.url}/?sum=Train/mean_reward,Loss/critic:min&sort=-sum:Train/mean_reward&cols=updates_per_step")
            browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length === 3")
            browser.screenshot(IMAGES / "web-runs.png")
            browser.goto(f"{server.url}/runs/sac-ups-4?smooth=0.6")
            browser.wait_for("document.querySelector('#verdict') && window.otelRl.charts['Loss/critic'] > 0")
            time.sleep(0.5)
            browser.screenshot(IMAGES / "web-run.png")
            browser.goto(f"{server.url}/compare?runs=sac-ups-1,sac-ups-4")
            browser.wait_for("document.querySelector('#compare-verdicts li') && window.otelRl.charts['Loss/critic'] > 0")
            time.sleep(0.5)
            browser.screenshot(IMAGES / "web-compare.png")
        finally:
            browser.close()
    print(f"written: {', '.join(str(IMAGES / n) for n in ('web-runs.png', 'web-run.png', 'web-compare.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

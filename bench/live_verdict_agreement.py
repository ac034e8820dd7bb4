"""How often the live verdict agrees with the end-of-run one, over loops shaped like the suite's runs.

    python bench/live_verdict_agreement.py [--seconds 5]

Each loop runs in a fresh process with a run folder, steady from start to end
(a run whose bottleneck moves is a disagreement by design: the trace reads the
whole run, the live verdict its last seconds). Then the last ``bottleneck``
event of its ``metrics.jsonl`` is compared with ``otel-rl analyze``'s verdict
of its trace, by side and phase (and rank); the table shows both lines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from otel_rl.readers.analysis import analyze

PRELUDE = """
import sys, threading, time, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0, quiet=True)
SECONDS = float(sys.argv[2])
def phase(name, ms, timeline="learner"):
    with tel.phase(name, timeline):
        time.sleep(ms / 1000)
"""

LOOPS = {
    "learner-bound (web page's runs)": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("collector_wait", 1); phase("learning", 8)
            i += 1
    """,
    "collector-bound": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("collector_wait", 8); phase("learning", 2)
            i += 1
    """,
    "inference-heavy learner": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("collector_wait", 0.5)
                with tel.phase("inference"):
                    phase("inference_forward", 6)
                phase("learning", 2)
            i += 1
    """,
    "turns, collector-bound (SB3-like)": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i, timeline="collector"):
                phase("env_step", 8, "collector")
            with tel.iteration(i, env_steps=8 * i):
                phase("learning", 2)
            i += 1
    """,
    "turns, learner-bound (SB3-like)": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i, timeline="collector"):
                phase("env_step", 2, "collector")
            with tel.iteration(i, env_steps=8 * i):
                phase("learning", 8)
            i += 1
    """,
    "time in no phase": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("learning", 2); time.sleep(0.008)
            i += 1
    """,
    "collector thread beside the learner (the deployment's loop)": """
        stop = threading.Event()
        def collector():
            tick = 0
            while not stop.is_set():
                with tel.iteration(tick, env_steps=8 * tick, timeline="collector"):
                    phase("learner_action_wait", 1.5, "collector"); phase("env_step", 7, "collector")
                tick += 1
        thread = threading.Thread(target=collector); thread.start()
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("collector_wait", 3); phase("learning", 12)
            i += 1
        stop.set(); thread.join()
    """,
    "slow iterations (100 ms)": """
        i = 0
        while time.monotonic() - start < SECONDS:
            with tel.iteration(i, env_steps=8 * i):
                phase("collector_wait", 10); phase("learning", 90)
            i += 1
    """,
}


def run(name: str, body: str, seconds: float, folder: Path) -> tuple[dict, str]:
    script = PRELUDE + "with tel.run():\n    start = time.monotonic()\n" + textwrap.indent(textwrap.dedent(body), "    ") + "tel.close()\n"
    subprocess.run([sys.executable, "-c", script, str(folder), str(seconds)], check=True, timeout=seconds + 120,
                   env={"OTEL_RL_PANEL": "0", "PATH": "/usr/bin:/bin"})  # fmt: skip
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    verdicts = [r["attributes"] for r in records if r.get("kind") == "event" and r.get("name") == "bottleneck"]
    return (verdicts[-1] if verdicts else {}), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    agree = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, body) in enumerate(LOOPS.items()):
            folder = Path(tmp) / f"run{n}"
            live, _ = run(name, body, args.seconds, folder)
            final = analyze(folder).diagnosis
            same = (live.get("side") or None, live.get("phase") or None, live.get("rank")) == (final.side, final.phase, final.rank)
            agree += same
            print(f"{'agrees   ' if same else 'DIFFERS  '} {name:60s} live: {live.get('text', '(none said)')!s:45s} trace: {final.bottleneck}")
    print(f"\n{agree} of {len(LOOPS)} runs: the live verdict agrees with the end-of-run one")


if __name__ == "__main__":
    main()

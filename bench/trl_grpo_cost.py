"""What otel-rl costs a TRL GRPO step: the same tiny run with and without it, CPU times in one run of this script.

    python bench/trl_grpo_cost.py [--steps 30] [--rounds 3]

Each arm is a fresh process training ``examples/trl_grpo.py``'s GPT-2 on the CPU for ``--steps`` optimizer steps,
``with`` otel-rl (the defaults a user has: system metrics on, the run folder, the agent) or ``without``; the rounds
interleave the arms. The CPU of an arm is the process's and its children's (the agent process's included, as the
training process reaps it), from ``resource.getrusage(RUSAGE_CHILDREN)``; the medians are printed, per step, with
their ratio, and then what ``otel-rl analyze`` says of the last ``with`` run: the share its phases account for, Other,
and the verdict.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {examples!r})
    import trl_grpo
    run_dir, steps, arm = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    trainer = trl_grpo.trainer(run_dir + "/trl", steps)
    if arm == "with":
        import otel_rl
        from otel_rl.integrations.trl import instrument
        tel = otel_rl.init(run_dir=run_dir, algorithm="grpo")
        instrument(trainer, tel)
        trainer.train()
        tel.close()
    else:
        trainer.train()
    """
).format(examples=str(REPO / "examples"))


def arm(name: str, steps: int, folder: Path) -> float:
    """CPU seconds of one arm's process and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(steps), name], check=True, capture_output=True, timeout=900,
                   env={"PATH": "/usr/bin:/bin", "OTEL_RL_PANEL": "0", "HOME": str(folder)})  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        last = None
        for r in range(args.rounds):
            for name in ("without", "with"):
                folder = Path(tmp) / f"{name}{r}"
                cpu[name].append(arm(name, args.steps, folder))
                last = folder if name == "with" else last
        without, with_ = statistics.median(cpu["without"]), statistics.median(cpu["with"])
        print(f"{args.steps} GRPO steps, median of {args.rounds} rounds, CPU seconds (the process and its agent)")
        print(f"  without otel-rl: {without:.2f} s ({1000 * without / args.steps:.0f} ms a step)")
        print(f"  with otel-rl:    {with_:.2f} s ({1000 * with_ / args.steps:.0f} ms a step)")
        print(f"  ratio: {with_ / without:.3f}")
        from otel_rl.readers.analysis import analyze

        report = analyze(last)
        learner = report.timelines["learner"]
        print(f"  phases account for {100 * (learner.accounted_share + learner.stall_share):.1f}% of the step, Other {100 * learner.other_share:.1f}%")
        print(f"  verdict: {report.diagnosis.bottleneck}")


if __name__ == "__main__":
    main()

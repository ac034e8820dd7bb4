"""``otel-rl``: the command line."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="otel-rl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the instrumented training demo")
    demo.add_argument("--seconds", type=float, default=20.0, help="wall-clock budget")
    demo.add_argument("--iterations", type=int, default=None, help="stop after this many learner iterations")
    demo.add_argument("--runs-dir", default="runs", help="parent folder of the run folder")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from otel_rl.demo import run_demo

        return run_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

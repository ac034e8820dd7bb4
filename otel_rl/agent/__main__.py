"""``python -m otel_rl.agent SEGMENT [--takeover N]``: the agent process a producer starts (see :mod:`otel_rl.agent.host`)."""

import argparse

from otel_rl.agent.host import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m otel_rl.agent", description=__doc__)
    parser.add_argument("segment", help="the producer's segment file")
    parser.add_argument("--takeover", type=int, default=0, help="agents that served this segment before")
    args = parser.parse_args()
    raise SystemExit(main(args.segment, args.takeover))

"""``python -m otel_rl.agent SEGMENT``: the agent process a producer starts (see :mod:`otel_rl.agent.host`)."""

import sys

from otel_rl.agent.host import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m otel_rl.agent SEGMENT")
    sys.exit(main(sys.argv[1]))

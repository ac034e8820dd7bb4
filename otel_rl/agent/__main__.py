"""``python -m otel_rl.agent --dir DIRECTORY [--linger S]``: the agent process (see :mod:`otel_rl.agent.service`)."""

from __future__ import annotations

import argparse

from otel_rl.agent.service import main as serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_rl.agent", description=__doc__)
    parser.add_argument("--dir", required=True, help="the agent's directory of segments")
    parser.add_argument("--linger", type=float, default=None, help="seconds to wait, once idle, before ending (default: serve forever)")
    args = parser.parse_args(argv)
    return serve(args.dir, args.linger)


if __name__ == "__main__":
    raise SystemExit(main())

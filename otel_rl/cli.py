"""``otel-rl``: the command line.

Every wrong input ends with one line naming what is wrong and a non-zero
exit (2 for a wrong argument, with the subcommand's usage; 1 when the work
itself failed), never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import os
import socket
import sys
from pathlib import Path

from otel_rl.base import environment_variables as env
from otel_rl.base import extras
from otel_rl.base.extras import MissingExtra, require
from otel_rl.run import files

DESCRIPTION = "otel-rl: OpenTelemetry-native telemetry for reinforcement-learning training loops."


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535)")
    return port


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit status (a closed pipe on stdout, as in ``| head``, ends it quietly)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away: say nothing more (Python would report the pipe again at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except MissingExtra as exc:
        print(f"otel-rl: {exc}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.run(args, parser)


def _parser() -> argparse.ArgumentParser:
    from otel_rl.demo import add_arguments
    from otel_rl.version import __version__

    parser = argparse.ArgumentParser(prog="otel-rl", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"otel-rl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, run) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        sub.set_defaults(run=run)
        return sub

    add_arguments(command("demo", "train SAC on Pendulum with every phase instrumented", _demo))
    _serve_arguments(command("serve", "run the motrix.metrics/v1 ingest server", _serve))
    backfill = command("backfill", "replay a run's metrics.jsonl into an ingest service", _backfill)
    backfill.add_argument("run_dir", help="run folder (or the metrics.jsonl file)")
    backfill.add_argument("--url", default=os.environ.get(env.MOTRIX_METRICS_URL), help="service base URL (MOTRIX_METRICS_URL)")
    backfill.add_argument("--retry-window", type=float, default=60.0, help="seconds to retry a service that is down before giving up")
    backfill.add_argument("--trace-only", action="store_true", help="send only the trace and its diagnosis (what an agent does when a run ends)")
    export = command("export", "write runs and their scalars as Parquet or CSV files (for notebooks and spreadsheets)", _export)
    export.add_argument("source", help="run folder, folder of run folders, or server URL (token: MOTRIX_METRICS_TOKEN)")
    export.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="file format (default parquet)")
    export.add_argument("--out", default="export", help="folder to write runs.<format> and scalars.<format> into (default ./export)")
    export.add_argument("--run", dest="run_id", help="only this run id")
    analyze = command("analyze", "say where the time goes, from a run's Perfetto trace", _analyze)
    analyze.add_argument("path", nargs="+", help="trace file or run folder; several: one job's parts (each machine's own folder)")
    analyze.add_argument("--engine", choices=("auto", "python", "sql"), default="auto", help="sql needs a trace processor binary")
    analyze.add_argument("--trace-processor", help="trace_processor_shell binary for the SQL engine")
    analyze.add_argument("--json", action="store_true", help="print the report as JSON")
    analyze.add_argument("--plot", metavar="FILE.png", help="also draw the timeline and phase shares")
    analyze.add_argument("--compare", metavar="BASELINE", help="trace file or run folder of another run: what changed, and a verdict")
    analyze.add_argument("--merged-trace", metavar="FILE", help="also write every part as one trace on rank 0's clock (for ui.perfetto.dev)")
    agent = command("agent", "serve every training process that sets OTEL_RL_AGENT=NAME (one agent for a machine's ranks and workers)", _agent)
    agent.add_argument("name", help="the agent's name (1 to 64 of A-Z a-z 0-9 _ . -)")
    agent.add_argument("--linger", type=float, default=None, help="end after this many idle seconds (default: serve until interrupted)")
    return parser


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    serve.add_argument("--port", type=_port, default=8080, help="TCP port")
    serve.add_argument("--db", default="motrix-metrics.sqlite3", help="SQLite database file, or a postgresql:// URL (for teams)")
    serve.add_argument("--lost-after", type=float, default=60.0, help="seconds of silence before a run is lost")
    serve.add_argument("--max-trace-mb", type=_positive, default=256.0, help="a run's trace at most (decompressed, MB); larger ones are refused (413)")
    serve.add_argument("--max-media-mb", type=_positive, default=64.0, help="one video or image at most (MB); larger ones are refused (413)")
    serve.add_argument(
        "--require-token",
        action="store_true",
        help="require MOTRIX_METRICS_TOKEN as a bearer token (read from the environment, never from the command line);"
        " implied whenever that variable is set",
    )
    serve.add_argument("--insecure", action="store_true", help="serve without a token even though MOTRIX_METRICS_TOKEN is set")


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    extras.require(*extras.DEMO)
    from otel_rl.demo import run_demo

    return run_demo(args)


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    require(extras.SERVE)
    if args.db.startswith(("postgresql:", "postgres:")):
        require(extras.POSTGRES)
    from otel_rl.readers.server import serve_forever

    token = os.environ.get(env.MOTRIX_METRICS_TOKEN) or None
    if args.require_token and not token:
        parser.error("--require-token needs MOTRIX_METRICS_TOKEN in the environment")
    if token and args.insecure:
        logging.getLogger("otel_rl.readers.server").warning("MOTRIX_METRICS_TOKEN is set but --insecure serves without it")
        token = None
    try:
        serve_forever(args.db, args.host, args.port, token, args.lost_after, max_trace_bytes=int(args.max_trace_mb * 1e6),
                      max_media_bytes=int(args.max_media_mb * 1e6))
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) and not isinstance(exc, socket.gaierror):
            raise
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else str(exc)
        print(f"otel-rl serve: cannot listen on {args.host}:{args.port}: {why}", file=sys.stderr)
        return 1
    return 0


def _backfill(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from otel_rl.agent.send_run import send_run

    if not args.url:
        parser.error("--url (or MOTRIX_METRICS_URL) is required")
    return send_run(Path(args.run_dir), args.url, os.environ.get(env.MOTRIX_METRICS_TOKEN) or None, args.retry_window, args.trace_only)


def _export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    require(extras.READ)
    import otel_rl.read as read

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        runs = read.runs(args.source)
        if args.run_id is not None:
            runs = runs[runs["run_id"] == args.run_id]
        scalars = read.scalars(args.source, run_id=args.run_id).reset_index()
        if "run_id" not in scalars:
            scalars.insert(0, "run_id", runs["run_id"].iloc[0] if len(runs) else args.run_id)
        for name, frame in (("runs", runs), ("scalars", scalars)):
            path = out / f"{name}.{args.format}"
            frame.to_parquet(path, index=False) if args.format == "parquet" else frame.to_csv(path, index=False)
    except read.SourceError as exc:
        print(f"otel-rl export: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"otel-rl export: {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{len(runs)} runs, {len(scalars):,} scalars rows written to {out}/runs.{args.format} and {out}/scalars.{args.format}")
    return 0


def _agent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from otel_rl.agent import directory as agents
    from otel_rl.agent.service import AgentService

    try:
        directory = agents.agent_dir(args.name)
    except (ValueError, OSError) as exc:
        print(f"otel-rl agent: {exc}", file=sys.stderr)
        return 2
    if agents.agent_running(directory):
        print(f"otel-rl agent: an agent named {args.name!r} is already running", file=sys.stderr)
        return 1
    print(f"otel-rl agent: serving OTEL_RL_AGENT={args.name} (Ctrl-C to stop)", file=sys.stderr)
    try:
        return AgentService(directory, args.linger).run()
    except KeyboardInterrupt:
        return 0


def _analyze(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from google.protobuf.message import DecodeError

    from otel_rl.readers.analysis import read_trace
    from otel_rl.readers.analysis import analyze_model, render_text
    from otel_rl.readers.analysis.protobuf_engine import UnreadableTrace
    from otel_rl.readers.analysis.sql_engine import TraceProcessorUnavailable

    if args.plot:
        require(extras.PLOT)
    for flag, target in (("--plot", args.plot), ("--merged-trace", args.merged_trace)):
        if target and not os.path.isdir(os.path.dirname(os.path.abspath(target))):
            print(f"otel-rl analyze: {flag} {target}: no such folder", file=sys.stderr)
            return 2
    if args.merged_trace and _read_as_part(Path(args.merged_trace), args.path):
        print(f"otel-rl analyze: --merged-trace {args.merged_trace} would be read as one more part of the run: write it outside its folder", file=sys.stderr)
        return 2
    read = {}
    for path in (tuple(args.path), args.compare):
        if path is None:
            continue
        try:
            read[path] = read_trace(path, args.engine, args.trace_processor)
        except UnreadableTrace as exc:  # a file that is not a Perfetto trace, or one damaged inside
            print(f"otel-rl analyze: {exc}", file=sys.stderr)
            return 1
        except (FileNotFoundError, TraceProcessorUnavailable, ValueError) as exc:
            print(f"otel-rl analyze: {exc}", file=sys.stderr)
            return 2
        except (DecodeError, OSError) as exc:  # a file that is not a Perfetto trace, or cannot be read
            shown = ", ".join(path) if isinstance(path, tuple) else path
            print(f"otel-rl analyze: {shown} is not a readable Perfetto trace ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 1
    model, engine = read[tuple(args.path)]
    report = dataclasses.replace(analyze_model(model), engine=engine)
    if args.compare is not None:
        from otel_rl.readers.analysis.compare import compare_reports, render_comparison

        same = _same_settings(Path(args.path[0]), Path(args.compare))
        comparison = compare_reports(report, analyze_model(read[args.compare][0]), same_settings=same)
        print(json.dumps(comparison, indent=2) if args.json else render_comparison(comparison))
    else:
        print(json.dumps(report.to_json(), indent=2) if args.json else render_text(report))
    if args.plot:
        from otel_rl.readers.analysis.plot import plot

        plot(model, report, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.merged_trace:
        from otel_rl.readers.analysis import trace_files
        from otel_rl.readers.analysis.merge import merge_parts

        try:
            merge_parts(trace_files(args.path), Path(args.merged_trace))
        except OSError as exc:
            print(f"otel-rl analyze: --merged-trace {args.merged_trace}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"merged trace written to {args.merged_trace}", file=sys.stderr)
    return 0


_SETTINGS = ("program", "args", "algorithm", "family", "config", "num_envs", "total_steps", "git")
"""What ``run_config.json`` says about how a run was started, beside when and where: two runs alike here had the same settings."""


def _same_settings(run: Path, baseline: Path) -> bool | None:
    """Whether two runs (folders, or traces in their folders) had the same settings; None when either's is unknown."""
    settings = []
    for path in (run, baseline):
        try:
            written = json.loads(((path if path.is_dir() else path.parent) / files.CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return None
        git = written.get("git") if isinstance(written.get("git"), dict) else {}
        settings.append({key: (git.get("commit") if key == "git" else written.get(key)) for key in _SETTINGS})
    return settings[0] == settings[1]


def _read_as_part(target: Path, paths: list[str]) -> bool:
    """Whether a trace written at ``target`` would be read back as a part of the run folders ``paths``."""
    from otel_rl.run.files import TRACE_SUFFIX

    folder = target.resolve().parent
    return target.name.endswith(TRACE_SUFFIX) and any(Path(p).is_dir() and Path(p).resolve() == folder for p in paths)


if __name__ == "__main__":
    sys.exit(main())

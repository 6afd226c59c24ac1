"""The `eventide` command line. Stable: serve, send, ingest, run, show, demo (see README)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transforms.settings import ConfigError, get_settings


def _address(text: str | None, settings, stream: str) -> tuple[str, int]:
    if not text:
        return settings.bind_host, settings.ports[stream]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--to {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{settings.ports.get(stream, 7101)}")
    return host or "127.0.0.1", int(port)


def _files(paths: list[str]) -> list[Path]:
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"{p}: no such file")
        out.append(path)
    return out


def cmd_serve(args, settings) -> int:
    from orchestration.gateway import serve_forever

    serve_forever(settings)
    return 0


def cmd_send(args, settings) -> int:
    from orchestration.sender import send_files

    settings.group_of(args.stream)
    host, port = _address(args.to, settings, args.stream)
    n = send_files(args.stream, _files(args.files), host, port, end_of_day=args.end_of_day, marker=settings.marker)
    print(f"sent {n} messages to {args.stream} at {host}:{port}")
    return 0


def cmd_ingest(args, settings) -> int:
    from orchestration.sender import ingest_files

    settings.group_of(args.stream)
    n = ingest_files(settings, args.stream, _files(args.files), end_of_day=args.end_of_day)
    print(f"landed {n} messages in {args.stream} under {settings.landing}")
    return 0


def cmd_run(args, settings) -> int:
    from orchestration.runner import run_all

    summary = run_all(settings, summaries=not args.pipelines_only)
    for asset, check, passed, partition in summary.checks:
        if not passed:
            print(f"  check FAILED: {asset}{f'[{partition}]' if partition else ''} {check}")
    failed_checks = sum(not c[2] for c in summary.checks)
    print(f"checks: {len(summary.checks) - failed_checks} passed, {failed_checks} failed")
    for f in summary.failures:
        print(f"error: {f}", file=sys.stderr)
    return 0 if summary.ok and not failed_checks else 1


def cmd_show(args, settings) -> int:
    from orchestration.show import show_table

    print(show_table(settings, args.table, args.format, args.where, args.limit), end="")
    return 0


def cmd_demo(args, settings) -> int:
    from orchestration.demo import run_demo

    return run_demo(settings)


def cmd_generate(args, settings) -> int:
    if args.kind == "logs":
        from transforms.apps.log_generate import generate_logs

        info = generate_logs(Path(args.out), lines=args.count, days=args.days, seed=args.seed, crlf=args.crlf)
        print(f"wrote {info['lines']} log lines over {len(info['days'])} days to {args.out}")
        return 0
    from transforms.apps.market_generate import generate

    n = generate(args.kind, Path(args.out), symbols_file=args.symbols, count=args.count, seed=args.seed,
                 unknown_share=args.unknown_share)
    print(f"wrote {n} framed {args.kind} messages to {args.out}")
    return 0


def cmd_backfill(args, settings) -> int:
    from orchestration.backfill import backfill

    return backfill(settings, args.start, args.end)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eventide", description="Event-window analytics on Spark, Delta Lake and Dagster.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway: one TCP port per stream, landing every framed message")
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("send", help="send files to the gateway, one framed message per line (.msg files as is)")
    s.add_argument("stream")
    s.add_argument("files", nargs="+")
    s.add_argument("--to", help="HOST:PORT of the gateway (default: the stream's port on loopback)")
    s.add_argument("--end-of-day", action="store_true", help="send a framed END_OF_DAY after each file")
    s.set_defaults(fn=cmd_send)

    s = sub.add_parser("ingest", help="land files without a network (same messages as send)")
    s.add_argument("stream")
    s.add_argument("files", nargs="+")
    s.add_argument("--end-of-day", action="store_true")
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("run", help="process everything landed so far through Dagster (pipelines, summaries, checks)")
    s.add_argument("--pipelines-only", action="store_true", help="skip the daily summaries")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("show", help="print a Delta table")
    s.add_argument("table")
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.add_argument("--where", help="SQL filter, e.g. \"day = '2004-03-07'\"")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("demo", help="run everything on the bundled sample data and print the results")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("generate", help="write framed .msg files of orders or market data, or Apache logs")
    s.add_argument("kind", choices=("orders", "market", "logs"))
    s.add_argument("--out", required=True)
    s.add_argument("--symbols", help="file with one symbol per line (default: the bundled 350 symbols)")
    s.add_argument("--count", type=int, default=1000)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--unknown-share", type=float, default=0.0, help="share of messages for never-seen symbols")
    s.add_argument("--days", type=int, default=7, help="logs: days of logs (a .log file gets END_OF_DAY lines)")
    s.add_argument("--crlf", action="store_true", help="logs: CRLF line endings")
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("backfill", help="recompute daily summaries for a range of days from bronze (Dagster backfill)")
    s.add_argument("start", help="first day, YYYY-MM-DD")
    s.add_argument("end", nargs="?", help="last day (inclusive), default: start")
    s.set_defaults(fn=cmd_backfill)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = get_settings()
        return args.fn(args, settings) or 0
    except (ConfigError, ValueError, FileNotFoundError, ConnectionError, RuntimeError) as e:
        print(f"eventide {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

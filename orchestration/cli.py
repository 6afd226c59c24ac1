"""The `eventide` command line. Stable: serve, send, ingest, run, show, sql, quarantine, apps, new, demo (see README)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
from pathlib import Path

from orchestration.console import console
from transforms.ports import LOOPBACK
from transforms.settings import ConfigError, get_settings, reset_settings

_ANY_ADDRESS = ("", "0.0.0.0", "::")


def _address(text: str | None, settings, stream: str) -> tuple[str, int]:
    """Where to send a stream: --to, else the port a running `eventide serve` recorded, else the
    stream's configured port (EVENTIDE_PORTS or its source's `port`)."""
    if text:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"--to {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7101")
        return host or LOOPBACK, int(port)
    from transforms.ingestion.gateway import running_gateway, state_path

    settings.registry.stream(stream)  # an unknown stream: say so, not "no port"
    running = running_gateway(settings)
    if running and stream in running["ports"]:
        host = running["host"]
        return (LOOPBACK if host in _ANY_ADDRESS else host), running["ports"][stream]
    port = settings.port_of(stream)
    if port:
        return (LOOPBACK if settings.bind_host in _ANY_ADDRESS else settings.bind_host), port
    if running:
        raise ConfigError(
            f"the gateway running for {settings.home} (pid {running['pid']}) does not serve stream {stream!r}: "
            "restart `eventide serve` with its app registered (EVENTIDE_APPS or --app), or pass --to HOST:PORT"
        )
    raise ConfigError(
        f"no port known for stream {stream!r}: no running `eventide serve` recorded one in {state_path(settings)}, "
        "and neither EVENTIDE_PORTS nor its source sets one. Start `eventide serve` (same EVENTIDE_HOME), "
        "or pass --to HOST:PORT"
    )


def _framed(args) -> bool | None:
    """--framed / --lines, or None: guess from the file's extension (.msg = framed)."""
    return True if args.framed else False if args.lines else None


def _files(paths: list[str]) -> list[Path]:
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"{p}: no such file")
        out.append(path)
    return out


def cmd_serve(args, settings) -> int:
    from transforms.ingestion import open_log
    from transforms.ingestion.gateway import serve_forever

    open_log(settings).check()  # Kafka: unreachable stops here, naming the address

    service = None
    if not args.gateway_only:
        from orchestration.service import Service

        settings.registry  # noqa: B018 - a broken app stops serve before any port opens
        service = Service(settings, say=lambda line: print(line, flush=True))
    serve_forever(settings, service=service)
    if service is not None and service.error is not None:
        print(f"eventide serve: the queries did not run: {service.error}", flush=True)
        return 1
    if service is not None:
        from orchestration.runner import pipelines_caught_up

        if pipelines_caught_up(settings):
            print("every query caught up: the pipelines sensor's cursor moves on (the UI's daemon starts no run "
                  "for it)", flush=True)
    print(f"eventide serve stopped: {service.summary()}" if service else "eventide serve stopped", flush=True)
    return 0


def cmd_send(args, settings) -> int:
    from transforms.ingestion.gateway import framing_of
    from transforms.ingestion.sender import send_files

    settings.group_of(args.stream)
    files = _files(args.files)
    host, port = _address(args.to, settings, args.stream)
    n = send_files(args.stream, files, host, port, end_of_day=args.end_of_day, marker=settings.marker,
                   framing=framing_of(settings), framed=_framed(args),
                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"sent {n} messages to {args.stream} at {host}:{port}")
    return 0


def cmd_ingest(args, settings) -> int:
    from transforms.ingestion import open_log
    from transforms.ingestion.sender import ingest_files

    settings.group_of(args.stream)
    files = _files(args.files)
    log = open_log(settings)
    log.check()
    n = ingest_files(settings, args.stream, files, end_of_day=args.end_of_day, framed=_framed(args))
    print(f"landed {n} messages in {args.stream} in {log.describe()}")
    return 0


@contextlib.contextmanager
def collector_held_off():
    """Python's cyclic collector off while a command starts, then back, with what the start built frozen
    out of its way (gc.freeze: it lives as long as the command). The start imports Dagster,
    great-expectations and pyspark and builds the definitions: hundreds of thousands of objects, which
    the collector scanned again and again as they were made (the imports alone: 3.4-3.6 s without it,
    4.4 s with it). Yields the call that ends the start; leaving the block ends it too."""
    was_on, done = gc.isenabled(), []

    def start_done() -> None:
        if not done:
            done.append(True)
            gc.freeze()
            if was_on:
                gc.enable()

    gc.disable()
    try:
        yield start_done
    finally:
        start_done()


def cmd_run(args, settings) -> int:
    from transforms.engine.runner import home_has_work
    from transforms.ingestion import open_log
    from transforms.spark import start_in_background

    open_log(settings).check()

    # The console first: the JVM's start redirects standard output to the Spark log for a while.
    with console() as say, collector_held_off() as start_done:
        # The JVM starts (2-4 s) while Dagster is imported and the definitions are built; none if nothing is new.
        starting = start_in_background(settings) if home_has_work(settings) else None
        from orchestration.runner import run_all

        summary = run_all(settings, progress=say, summaries=not args.pipelines_only, spark_starting=starting,
                          started=start_done)
    # Everything ran that could; now every failure, then the exit status.
    for f in summary.check_failures:
        print("\n".join(f.lines()))
    if summary.not_materialized:
        print(f"  not materialized (downstream of a failure): {', '.join(summary.not_materialized)}")
    for held in summary.held_back:
        print(f"  held back: {held}")
    failed_checks = summary.failed_checks
    print(f"checks: {len(summary.checks) - failed_checks} passed, {failed_checks} failed")
    for f in summary.failures:
        print(f"error: {f}", file=sys.stderr)
    return 0 if summary.passed else 1


def cmd_show(args, settings) -> int:
    from orchestration.show import show_table

    print(show_table(settings, args.table, args.format, args.where, args.limit), end="")
    return 0


def cmd_sql(args, settings) -> int:
    from orchestration.show import sql_query

    print(sql_query(settings, args.query, args.format), end="")
    return 0


def cmd_upkeep(args, settings) -> int:
    from transforms import lake
    from transforms.spark import get_spark

    print(f"compacting and vacuuming the tables under {settings.lake} (files older than {settings.vacuum_hours:g} h)")
    for r in lake.upkeep(get_spark(settings), settings.lake, settings.vacuum_hours,
                         log_retention_hours=settings.log_retention_hours):
        print(f"  {r.table}: {r.files_before} -> {r.files_after} files, {r.vacuumed} deleted from disk")
    return 0


def cmd_quarantine(args, settings) -> int:
    from orchestration.deadletter import replay_and_run, show_quarantine

    if args.action == "replay":
        with console() as say:
            return replay_and_run(settings, args.stream, args.reason, progress=say)
    print(show_quarantine(settings, args.stream, args.reason, args.format, args.limit), end="")
    return 0


def cmd_apps(args, settings) -> int:
    from orchestration.listing import describe_apps, format_apps

    print(format_apps(describe_apps(settings), args.format), end="")
    return 0


def cmd_status(args, settings) -> int:
    from orchestration.status import compute_status, format_status

    print(format_status(compute_status(settings), args.format, settings), end="")
    return 0


def cmd_new(args, settings) -> int:
    from orchestration.scaffold import scaffold

    folder = Path(args.dir)
    paths = scaffold(args.name, folder)
    name = args.name
    print(f"wrote {', '.join(p.name for p in paths)} in {folder.absolute()}")
    print(f"next, in that folder:\n  export EVENTIDE_APPS={name}:app\n  eventide ingest {name} {name}_sample.txt\n"
          f"  eventide run\n  eventide show {name}_totals\n  pytest test_{name}.py")
    return 0


def ui_command(settings, port: int, cwd: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """`dagster dev` over Eventide's workspace, with the same home and apps, and the current folder
    importable (a user's app lives there; Dagster's code server runs from the repo)."""
    cwd = (cwd or Path.cwd()).absolute()
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["EVENTIDE_HOME"] = str(settings.home.absolute())
    env["EVENTIDE_APPS"] = settings.apps
    env["DAGSTER_HOME"] = str(settings.dagster_home.absolute())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd), env.get("PYTHONPATH", "")) if p)
    dagster = Path(sys.executable).with_name("dagster")
    argv = [str(dagster), "dev", "-w", str(repo / "workspace.yaml"), "-h", LOOPBACK, "-p", str(port)]
    return argv, env


def cmd_ui(args, settings) -> int:
    from orchestration.runner import dagster_instance

    dagster_instance(settings)  # writes the instance config under the home
    argv, env = ui_command(settings, args.port)
    print(f"Dagster UI on http://127.0.0.1:{args.port} (apps: {settings.apps}; home: {settings.home.absolute()})",
          flush=True)
    os.execve(argv[0], argv, env)
    return 0  # not reached


def cmd_kafka(args, settings) -> int:
    from transforms.kafka_broker import run_broker

    folder = Path(args.dir) if args.dir else settings.home / "kafka"
    return run_broker(folder, args.port, args.controller_port, say=lambda line: print(line, flush=True))


def cmd_demo(args, settings) -> int:
    from orchestration.demo import run_demo

    return run_demo(settings)


def cmd_generate(args, settings) -> int:
    if args.kind == "logs":
        from examples.log_generate import generate_logs

        info = generate_logs(Path(args.out), lines=args.count, days=args.days, seed=args.seed, crlf=args.crlf)
        print(f"wrote {info['lines']} log lines over {len(info['days'])} days to {args.out}")
        return 0
    from examples.market_generate import generate

    n = generate(args.kind, Path(args.out), symbols_file=args.symbols, count=args.count, seed=args.seed,
                 unknown_share=args.unknown_share)
    print(f"wrote {n} framed {args.kind} messages to {args.out}")
    return 0


def cmd_backfill(args, settings) -> int:
    from orchestration.backfill import backfill

    return backfill(settings, args.start, args.end)


def _app_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", action="append", metavar="MODULE:ATTR",
                        help="register this app instead of EVENTIDE_APPS (repeatable)")


def _file_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stream")
    parser.add_argument("files", nargs="+")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--framed", action="store_true", help="files hold length-prefixed frames (default for .msg)")
    how.add_argument("--lines", action="store_true", help="one message per line (default for other files)")
    parser.add_argument("--end-of-day", action="store_true", help="a message END_OF_DAY after each file")
    _app_option(parser)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eventide", description="Event-window analytics on Spark, Delta Lake and Dagster.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the service: one TCP port per registered stream, and every app's "
                                     "queries continuously (outputs within a second)")
    s.add_argument("--gateway-only", action="store_true",
                   help="run only the gateway: land messages; `eventide run` processes them")
    _app_option(s)
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("send", help="send files to a running gateway (text: a message per line; .msg: frames)")
    _file_options(s)
    s.add_argument("--to", metavar="HOST:PORT",
                   help="where to send (default: the port `eventide serve` recorded, else the stream's port)")
    s.set_defaults(fn=cmd_send)

    s = sub.add_parser("ingest", help="land files without a network (same messages as send)")
    _file_options(s)
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("run", help="process everything landed so far through Dagster (pipelines, summaries, checks)")
    s.add_argument("--pipelines-only", action="store_true", help="skip the daily summaries")
    s.add_argument("--close-windows", action="store_true",
                   help="the input is finished: close every key's open windows at the end (reason end_of_input; "
                        "also EVENTIDE_CLOSE_WINDOWS=1)")
    _app_option(s)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("show", help="print a Delta table")
    s.add_argument("table")
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.add_argument("--where", help="SQL filter, e.g. \"day = '2004-03-07'\"")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("apps", help="list the registered apps: streams and ports, tables, TCP sinks")
    s.add_argument("--format", choices=("table", "json"), default="table", help="json: one object per line")
    _app_option(s)
    s.set_defaults(fn=cmd_apps)

    s = sub.add_parser("new", help="write a starter app NAME.py, a sample input and its test")
    s.add_argument("name", help="the app's name, a Python identifier: its module, stream and tables")
    s.add_argument("--dir", default=".", help="folder to write into (default: the current one)")
    s.set_defaults(fn=cmd_new)

    s = sub.add_parser("quarantine", help="the dead-letter queue: counts, rows (--stream/--reason), replay after a fix")
    s.add_argument("action", nargs="?", choices=("replay",),
                   help="replay: land the selected messages again and run the pipelines (current decoders)")
    s.add_argument("--stream", help="only this stream")
    s.add_argument("--reason", help="only reasons containing this text (any case)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="json: one object per line")
    s.add_argument("--limit", type=int, default=None, help="rows to show at most")
    _app_option(s)
    s.set_defaults(fn=cmd_quarantine)

    s = sub.add_parser("ui", help="serve the Dagster UI (lineage, runs, checks) over the same home and apps")
    s.add_argument("--port", type=int, default=3000)
    _app_option(s)
    s.set_defaults(fn=cmd_ui)

    s = sub.add_parser("kafka", help="run Apache Kafka (one KRaft node, 127.0.0.1) in the foreground for "
                                     "development and tests; SIGTERM or Ctrl-C stops it")
    s.add_argument("--port", type=int, default=9092, help="the clients' port (bootstrap.servers), default 9092")
    s.add_argument("--dir", help="its configuration and data, formatted on first use (default: <home>/kafka)")
    s.add_argument("--controller-port", type=int, help="the KRaft controller's port (default: a free one)")
    s.set_defaults(fn=cmd_kafka)

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

    s = sub.add_parser("backfill", help="recompute the apps' daily partitions for a range of days (Dagster backfill)")
    s.add_argument("start", help="first day, YYYY-MM-DD")
    s.add_argument("end", nargs="?", help="last day (inclusive), default: start")
    _app_option(s)
    s.set_defaults(fn=cmd_backfill)

    s = sub.add_parser("sql", help="run Spark SQL over the home's tables (named as `show` names them)")
    s.add_argument("query", help='e.g. "SELECT status, count(*) AS n FROM bronze_log_lines GROUP BY status"')
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.set_defaults(fn=cmd_sql)

    s = sub.add_parser("upkeep", help="compact the tables' small files and vacuum old ones (EVENTIDE_VACUUM_HOURS)")
    s.set_defaults(fn=cmd_upkeep)

    s = sub.add_parser("status", help="how far each landing log and query has got: landed, processed, lag "
                                      "(reads the home's files only: no Spark)")
    s.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: one object (its shape: orchestration/status.py)")
    _app_option(s)
    s.set_defaults(fn=cmd_status)
    return p


def _settings(args):
    """The settings; `--app` replaces EVENTIDE_APPS, in the environment too, so that Dagster code run in
    this process (it reads settings itself) registers the same apps."""
    apps = getattr(args, "app", None)
    if apps:
        os.environ["EVENTIDE_APPS"] = ",".join(apps)
        reset_settings()
    if getattr(args, "close_windows", False):  # the assets read the settings from the environment too
        os.environ["EVENTIDE_CLOSE_WINDOWS"] = "1"
        reset_settings()
    return get_settings()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        return args.fn(args, settings) or 0
    except (ConfigError, ValueError, FileNotFoundError, ConnectionError, RuntimeError) as e:
        # ConfigError covers transforms.registry.AppLoadError: an app that cannot load, named with its module.
        print(f"eventide {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The `eventide` command: `main`, then exit without tearing the interpreter down. Everything is
    written by then (Delta commits, checkpoints, the Dagster instance are synchronous; a Spark JVM
    exits when its gateway's pipe closes), and the teardown of Dagster's, GX's and Spark's modules
    took 1.2 s of every command (measured on `eventide run` with nothing new: 6.7 s -> 5.5 s)."""
    rc = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`eventide show | head`): nothing left to say
            pass
    os._exit(rc)


if __name__ == "__main__":
    entry()

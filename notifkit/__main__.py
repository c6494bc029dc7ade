"""``python -m notifkit``: serve (default), migrate, dev.

    python -m notifkit                              # every service
    python -m notifkit --services api,engine        # a subset (serve is the default command)
    python -m notifkit serve --services api,engine  # the same
    python -m notifkit migrate                      # apply database migrations, then exit

Configuration comes from the environment (see the README's table). Invalid configuration
exits with status 2 and one line naming the variable.
"""

from __future__ import annotations

# First, before the imports below (a second or more on a first run, which compiles them): a
# SIGTERM or Ctrl-C while they load is kept and obeyed once the command handles signals (a
# clean stop; 130 for migrate), not the default kill or a traceback from inside an import.
from notifkit.stop_signals import defer_stop_signals, resume_stop_signals

if __name__ == "__main__":
    defer_stop_signals()

import argparse
import asyncio
import contextlib
import difflib
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from notifkit import __version__
from notifkit.config import (
    LOG_FORMATS,
    ConfigError,
    Settings,
    parse_services,
    port_given_as,
    warn_of_risky_settings,
)
from notifkit.gc_tuning import tune_gc
from notifkit.log import RepeatFilter, process_service_name, set_process_service, setup_logging

log = logging.getLogger("notifkit")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (exit 2) rather than usage + error."""

    def error(self, message: str) -> NoReturn:
        text = f"{self.prog}: invalid arguments: {message} (see --help)"
        # The command the words name, not the parser's: argparse reports an unknown option of
        # a command (``dev --bogus``) from the top parser, which names none.
        command = _command_given
        if intended_log_format(command, os.environ) == "json":
            # Whatever collects JSON logs parses every line, this one too.
            setup_logging("json", "INFO")
            set_process_service(command)
            named = re.match(r"argument ([^:\s]+)", message)
            setting = named.group(1).split("/")[0] if named else "arguments"
            log.error("%s", text, extra={"setting": setting})
            sys.exit(2)
        self.exit(2, text + "\n")


class _Once(argparse.Action):
    """Store an option's value, refusing the option a second time: argparse kept the last
    value without a word, so ``--services api --services delivery`` ran delivery alone."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given: set[str] = namespace.__dict__.setdefault("_options_given", set())
        if self.dest in given:
            hint = " (it takes a comma-separated list)" if self.dest == "services" else ""
            parser.error(f"argument {'/'.join(self.option_strings)}: given twice; give it "
                         f"once{hint}")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")
PROG = "python -m notifkit"
COMMANDS = ("serve", "migrate", "dev")
# The command the command line names (serve unless another is), for the parser's errors.
_command_given = "serve"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Reliable multi-channel notifications on Redis Streams and PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"notifkit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run services (the default command)")
    serve.add_argument(
        "--services", action=_Once,
        help="comma-separated services to run, or 'all' (default: NOTIFKIT_SERVICES or all)",
    )
    serve.add_argument("--port", type=whole_number, action=_Once,
                       help="HTTP port of the api service (default: PORT)")
    commands.add_parser("migrate", help="apply pending database migrations and exit")
    dev = commands.add_parser(
        "dev", help="run everything locally with the simulators as providers"
    )
    dev.add_argument("--data-dir", default=".notifkit", action=_Once,
                     help="where local data is kept (default: %(default)s)")
    dev.add_argument("--port", type=whole_number, action=_Once, default=8080,
                     help="HTTP port of the api service, on 127.0.0.1 unless HOST is set; "
                          "0 picks a free one (default: %(default)s)")
    dev.add_argument("--sim-port", type=whole_number, action=_Once, default=8025,
                     help="HTTP port of the simulators, on 127.0.0.1; 0 picks a free one "
                          "(default: %(default)s)")
    dev.add_argument("--sim-smtp-port", type=whole_number, action=_Once, default=2525,
                     help="SMTP port of the simulators, on 127.0.0.1; 0 picks a free one, "
                          "shown by GET /_sim/health (default: %(default)s)")
    return parser


def whole_number(text: str) -> int:
    """argparse's ``int`` in ASCII digits only: int() reads any script's, so a full-width
    ``--port ８０`` listened on port 80."""
    try:
        # int() also reads "8_080" and "+80", which no port is written as.
        if not re.fullmatch(r"-?[0-9]+", text):
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def load_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    services = getattr(args, "services", None)
    if services is not None:  # --services "" names no service: an error, not "all"
        overrides["services"] = parse_services(services, "--services")
    port = getattr(args, "port", None)
    if port is not None:
        if not 0 <= port <= 65535:
            raise ConfigError("--port", f"must be a TCP port (0-65535), got {port}")
        overrides["port"] = port
    given: dict[int, str] = {} if port is None else {port: "--port"}
    for option, value in (("--sim-port", getattr(args, "sim_port", None)),
                          ("--sim-smtp-port", getattr(args, "sim_smtp_port", None))):
        if value is not None and not 0 <= value <= 65535:
            raise ConfigError(option, f"must be a TCP port (0-65535), got {value}")
        # dev listens on each: the same port twice failed the second listener as "address
        # already in use", after the first had started, as if another program held it.
        if value and value in given:
            raise ConfigError(option, f"is {value}, the port given to {given[value]}; each "
                              "listener needs its own (0 picks a free one)")
        if value is not None:
            given[value] = option
    env: Mapping[str, str] = os.environ
    if getattr(args, "command", None) == "dev":
        # dev listens on --port; PORT does not apply to it, so a PORT left in the shell (one
        # meant for another program, say) is not read, let alone refused.
        env = {name: value for name, value in os.environ.items() if name != "PORT"}
    return Settings.from_env(env, **overrides)


async def serve(settings: Settings, port_option: str = "PORT") -> int:
    """Run until SIGTERM or SIGINT. ``port_option`` is what the user set the port with: a port
    given as ``--port`` that cannot be bound is named so, not as the PORT they never set."""
    from notifkit.stop_signals import stop_on_signals

    stop = asyncio.Event()
    # Before the server's modules are imported, which takes a while: a signal meanwhile stops
    # the start like any other.
    stop_on_signals(stop)
    from notifkit.server import NotifkitServer

    server = NotifkitServer(settings=settings)
    # A start can wait a long time (an unreachable PostgreSQL, a held migration lock); a SIGTERM
    # meanwhile abandons it rather than being ignored until it finishes.
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("Stopping while starting: whatever had started stops cleanly.")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await server.stop()
        return 0
    stopping.cancel()
    try:
        starting.result()
    except Exception as exc:
        await server.stop()
        if isinstance(exc, ConfigError) and exc.variable == "PORT":
            exc = port_given_as(exc, port_option)
        why = describe_failure(exc)
        log.error("notifkit could not start: %s", why, extra=setting_of(why))
        return 2 if isinstance(exc, ConfigError) else 1
    tune_gc()
    await stop.wait()
    log.info("Stopping: finishing in-flight work (up to %.0f s).", settings.shutdown_grace_s)
    await server.stop()
    return 0


async def migrate_only(settings: Settings) -> int:
    from notifkit.db.migrate import migrate

    applied = await migrate(settings)
    # Logged, not printed: with LOG_FORMAT=json every line the command writes is a record.
    log.info("Done: applied %d migration(s)%s.", len(applied),
             f" ({', '.join(applied)})" if applied else "")
    return 0


# The setting a start failure names first ("REDIS_URL: cannot connect ...", "--port: ...").
_NAMED_SETTING = re.compile(r"(--[a-z][a-z-]*|[A-Z][A-Z0-9_]+): ")


def setting_of(why: str) -> dict[str, str]:
    """``{"setting": name}`` for a JSON record about a failure that names its setting (as an
    invalid setting's record carries it), else nothing."""
    found = _NAMED_SETTING.match(why)
    return {"setting": found.group(1)} if found else {}


def describe_failure(exc: BaseException) -> str:
    """One line about why notifkit could not start, naming the setting behind it."""
    from redis.exceptions import RedisError

    text = str(exc) or type(exc).__name__
    if isinstance(exc, ConfigError):
        return text
    from notifkit.db.migrate import MigrationError

    if isinstance(exc, MigrationError):
        return f"DB_SCHEMA: {text}"
    if isinstance(exc, RedisError):
        return text if text.startswith("REDIS_URL: ") else f"REDIS_URL: cannot use Redis: {text}"
    import asyncpg

    if isinstance(exc, asyncpg.UndefinedTableError):
        # With AUTO_MIGRATE=false on a schema nobody migrated, the first query says only this.
        return (f"DB_SCHEMA: {text}: the schema has no notifkit tables yet; run "
                "'python -m notifkit migrate' or start with AUTO_MIGRATE=true")
    if isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError)):
        return f"DATABASE_URL: {text}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the process's own command line: its signals are this command's
        defer_stop_signals()
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0].startswith("-") and words[0] not in TOP_LEVEL_OPTIONS:
        words.insert(0, "serve")  # ``python -m notifkit --services api``: serve is the default
    global _command_given
    _command_given = words[0] if words and words[0] in COMMANDS else "serve"
    args = parser.parse_args(words)
    command = args.command or "serve"
    # Logging in the format asked for before the settings are read, so the warnings reading
    # them gives (EMAIL_TRANSPORT left to choose, say) come out as JSON records too, not as
    # Python's bare last-resort lines; the one repeat filter across both set-ups writes a
    # warning the settings give again, once the server checks them, only once.
    repeats = RepeatFilter()
    early_format = intended_log_format(command, os.environ)
    if early_format is not None:
        setup_logging(early_format, intended_log_level(os.environ), repeats=repeats)
        set_process_service(intended_process_service(command, args, os.environ))
    try:
        settings = load_settings(args)
    except ConfigError as exc:
        refuse(f"invalid configuration: {exc}", early_format, setting=exc.variable)
        return 2
    log_format = early_format or settings.log_format
    setup_logging(log_format, settings.log_level, repeats=repeats)
    # Records of the process itself (starting, stopping, migrating, a library's) name it too.
    set_process_service(command if command != "serve"
                        else process_service_name(settings.services))
    warn_unknown_settings(os.environ)
    if command == "serve":
        warn_of_risky_settings(settings)
    try:
        _install_event_loop()
        if command == "migrate":
            if argv is None:
                # migrate handles no signal itself: SIGTERM and Ctrl-C end it as usual.
                resume_stop_signals()
            return asyncio.run(migrate_only(settings))
        if command == "dev":
            from notifkit.dev import run_dev

            return asyncio.run(run_dev(
                settings, data_dir=args.data_dir, port=args.port,
                sim_port=args.sim_port, sim_smtp_port=args.sim_smtp_port,
            ))
        port_option = "--port" if getattr(args, "port", None) is not None else "PORT"
        return asyncio.run(serve(settings, port_option))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:
        refuse(f"invalid configuration: {exc}", log_format, setting=exc.variable)
        return 2
    except Exception as exc:
        import asyncpg
        from redis.exceptions import RedisError

        from notifkit.db.migrate import MigrationError
        from notifkit.dev import DemoError

        if not isinstance(exc, (OSError, RedisError, asyncpg.PostgresError,
                                asyncpg.InterfaceError, MigrationError, DemoError)):
            raise
        why = describe_failure(exc)
        refuse(why, log_format, **setting_of(why))
        return 1


# How alike a variable's name must be to a setting's to be taken for a misspelling of it.
MISSPELT_CUTOFF = 0.85


def warn_unknown_settings(env: Mapping[str, str]) -> None:
    """A warning for each variable that looks meant for notifkit but is none of its settings
    (``WORKER_CONCURENCY``, ``NOTIFKIT_ADMIN_TOKEN``): ignored without a word, it left the
    process on the default the operator meant to change. ``NOTIFKIT_TEST_*`` are the tests'."""
    from notifkit.config import VARIABLES

    for name in sorted(env):
        if name in VARIABLES or name.startswith("NOTIFKIT_TEST_"):
            continue
        close = difflib.get_close_matches(name, VARIABLES, n=1, cutoff=MISSPELT_CUTOFF)
        if not close:
            # A duration without its unit or with another (PROVIDER_TIMEOUT,
            # RECLAIM_INTERVAL_MS) is too unlike the setting for difflib.
            seconds = re.sub(r"_(S|SEC|SECS|MS)\Z", "", name) + "_SECONDS"
            close = [seconds] if seconds in VARIABLES else []
        if not close and not name.startswith("NOTIFKIT_"):
            continue
        hint = f"; did you mean {close[0]}?" if close else ""
        log.warning("%s is not a notifkit setting and is ignored%s", name, hint,
                    extra={"setting": name})


def intended_log_format(command: str, env: Mapping[str, str]) -> str | None:
    """The format the command logs in, known before the settings are: None when LOG_FORMAT
    is itself the invalid setting."""
    if command == "dev" and not (env.get("LOG_FORMAT") or "").strip():
        # The dev command speaks to a person at a terminal: readable unless asked otherwise.
        return "text"
    raw = (env.get("LOG_FORMAT") or "").strip().lower() or Settings.log_format
    return raw if raw in LOG_FORMATS else None


def intended_log_level(env: Mapping[str, str]) -> str:
    """LOG_LEVEL before the settings are read: INFO when it is unset or no level."""
    raw = (env.get("LOG_LEVEL") or "").strip().upper()
    return raw if raw in ("DEBUG", "INFO", "WARNING", "ERROR") else "INFO"


def intended_process_service(command: str, args: argparse.Namespace,
                             env: Mapping[str, str]) -> str | None:
    """What the records of a process whose settings are invalid name as their service: the
    command, or the services it was asked to run, when those at least can be read."""
    if command != "serve":
        return command
    raw = getattr(args, "services", None)
    if raw is None:
        raw = (env.get("NOTIFKIT_SERVICES") or "").strip() or "all"
    try:
        return process_service_name(parse_services(raw))
    except ConfigError:
        # The services are what cannot be read: the record names the command instead, as
        # migrate's do, so that every record still names a service.
        return command


def refuse(message: str, log_format: str | None, **fields: str) -> None:
    """The one line a command that cannot go on leaves: a JSON record when its logs are JSON,
    since whatever collects them parses every line, else plain text for a person."""
    if log_format == "json":
        log.error("%s", message, extra=fields)
    else:
        print(f"notifkit: {message}", file=sys.stderr)


def _install_event_loop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


if __name__ == "__main__":
    sys.exit(main())

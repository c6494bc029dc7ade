"""`python -m simulators`: run every provider simulator until SIGINT or SIGTERM.

    python -m simulators [--host 127.0.0.1] [--port 8025] [--smtp-port 2525] [--seed N]
                         [--max-messages 10000] [--log-level INFO]

Port 0 binds a free port; the line "Simulators listening on ..." says which.
Without --seed a random seed is chosen and logged, so any run can be replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn

from notifkit.gc_tuning import tune_gc
from notifkit.stop_signals import defer_stop_signals, stop_on_signals
from simulators.logs import LOG_FORMATS, setup_logging

# The server's modules (aiohttp, every provider) are imported only once the command handles
# SIGTERM and Ctrl-C (main), not when this module is: the scenarios and benchmarks import it
# for its argparse types too.

log = logging.getLogger("simulators")


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line that says what is wrong, exit status 2 (argparse's usage error)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def ascii_int(text: str) -> int:
    """``int()`` in ASCII digits only: int() reads any script's digits, so a full-width
    ``--port ８０`` listened on port 80."""
    if not text.isascii():
        raise ValueError(text)
    return int(text)


def _port(text: str) -> int:
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (a seed, say)."""
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


# The ring buffer's size is a C ssize_t; far past any memory, but a larger value must be a
# usage error, not an OverflowError.
MAX_MESSAGES = sys.maxsize


def _max_messages(text: str) -> int:
    value = positive_int(text)
    if value > MAX_MESSAGES:
        raise argparse.ArgumentTypeError(f"at most {MAX_MESSAGES}, got {value}")
    return value


def seed_value(text: str) -> int:
    """argparse type: a seed, no larger than ``POST /_sim/reset`` takes, so the seed a run
    logs can always replay it (the scenarios' ``--seed`` reaches the simulators too)."""
    from simulators.control import MAX_SEED

    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_SEED}, the largest seed POST /_sim/reset takes, got {value}")
    return value


def _host(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "must not be empty (0.0.0.0 listens on every interface)")
    # No name or address holds any; found only at the bind, the failure was a message broken
    # over several lines.
    if any(char.isspace() or not char.isprintable() for char in text):
        raise argparse.ArgumentTypeError(
            f"must be a host name or address, without white space or control characters, "
            f"got {text!r}")
    return text


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (a count, a concurrency)."""
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m simulators",
        description="Wire-compatible provider simulators (Resend, SendGrid, SMTP, Twilio, FCM, "
        "OpenAI) with fault injection. Control API and page under /_sim/.",
    )
    parser.add_argument("--host", type=_host, default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8025, help="HTTP port (default 8025)")
    parser.add_argument("--smtp-port", type=_port, default=2525, help="SMTP port (default 2525)")
    parser.add_argument("--seed", type=seed_value, default=None,
                        help="random seed for faults")
    parser.add_argument(
        "--max-messages",
        type=_max_messages,
        default=10_000,
        help="messages kept in memory, oldest dropped first (default 10000)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,  # either case, as notifkit's LOG_LEVEL
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default INFO: one line per received message",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        type=str.lower,
        choices=LOG_FORMATS,
        help="text (default) or json: one JSON object a line, as notifkit logs in production",
    )
    args = parser.parse_args(argv)
    if args.port and args.port == args.smtp_port:
        # The SMTP listener failed as "address already in use" once HTTP had taken the port,
        # as if another program held it.
        parser.error(f"argument --smtp-port: is {args.port}, the port given to --port; each "
                     "listener needs its own (0 picks a free one)")
    return args


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    from simulators.server import SimulatorServer

    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    server = SimulatorServer(
        host=args.host,
        port=args.port,
        smtp_port=args.smtp_port,
        seed=seed,
        max_messages=args.max_messages,
    )
    await server.start()
    tune_gc()
    try:
        log.info(
            "Simulators listening on %s (SMTP %s:%d), seed %d; page at %s/_sim/.",
            server.base_url,
            server.smtp_host,
            server.smtp_port,
            seed,
            server.base_url,
        )
        await stop.wait()
        log.info("Stopping: held requests are released and connections closed.")
    finally:
        await server.stop()


def _run(main: Coroutine[Any, Any, None]) -> None:
    """uvloop when installed (notifkit's "fast" extra): the simulators answer every request a
    benchmark or staging load sends, and the default loop costs them about a fifth more CPU."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: its signals are this command's
        # Kept until serve handles them, so a stop while the server's modules load is obeyed.
        defer_stop_signals()
    args = parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    from simulators.server import ListenError

    try:
        _run(serve(args))
    except ListenError as exc:
        option = {"port": "--port", "host": "--host"}.get(exc.which, "--smtp-port")
        print(f"python -m simulators: error: {option}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # Typically the port is taken or the host cannot be bound.
        print(f"python -m simulators: error: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

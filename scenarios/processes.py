"""OS processes of a scenario: notifkit services and the simulators, killed and restarted at will.

Each process writes its log to a file in the run's folder, so a failed scenario can be read
afterwards without drowning the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from notifkit.config import VARIABLES

# Ports handed to child processes come from below the kernel's ephemeral range (32768+ on
# Linux), so an outgoing connection cannot take one between our check and the child's bind.
_PORT_RANGE = (20000, 32000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, kept from other programs until
    the child process it is meant for binds it (see :func:`reserve_port`)."""
    for _ in range(200):
        try:
            return reserve_port(random.randint(*_PORT_RANGE))
        except OSError:
            continue
    return reserve_port(0)


def reserve_port(port: int) -> int:
    """Check ``port`` (0: any) is free and leave it in TIME_WAIT for a minute: a plain bind of
    it fails meanwhile (another run's check, this one's next choice, any program not asking
    for SO_REUSEADDR), while a server that sets SO_REUSEADDR, as asyncio's and redis-server
    do, binds it. A port only checked and let go was free for anyone until the child, seconds
    later, bound it, and a child that lost the race failed its run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        # Plain: refused while any socket holds the port, one in TIME_WAIT included.
        listener.bind(("127.0.0.1", port))
        # Inherited by the accepted socket below, whose TIME_WAIT then gives way to a server
        # with SO_REUSEADDR.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.listen(1)
        listener.settimeout(5)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()  # closed first, so the TIME_WAIT is on this port's side
    return port


@dataclass
class ManagedProcess:
    """One child process with a stable name, restartable with the same command and env."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    _log_files: list[object] = field(default_factory=list)

    async def start(self) -> None:
        log_file = self.log_path.open("ab")
        self._log_files.append(log_file)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, env=dict(self.env), stdout=log_file, stderr=log_file,
            start_new_session=True,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def signal(self, signum: int) -> None:
        if self.running and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL: the crash the contract promises to survive."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            await self.proc.wait()

    async def terminate(self, timeout_s: float = 15.0) -> int | None:
        if not self.running or self.proc is None:
            return self.proc.returncode if self.proc else None
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            await self.kill()
            return self.proc.returncode

    async def restart(self) -> None:
        if self.running:
            await self.kill()
        self.restarts += 1
        await self.start()

    def close_logs(self) -> None:
        for handle in self._log_files:
            with contextlib.suppress(Exception):
                handle.close()  # type: ignore[attr-defined]
        self._log_files.clear()

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def child_env(base: Mapping[str, str] | None = None, /, **extra: str) -> dict[str, str]:
    """``base`` (this process's environment) without notifkit's own settings, plus ``extra``.

    A shell set up to run notifkit (``NOTIFKIT_SIMULATOR_URL``, ``RESEND_BASE_URL``, ...) must
    not point a scenario's processes at other providers or stores than the scenario's own.
    """
    env = {name: value for name, value in (os.environ if base is None else base).items()
           if name not in VARIABLES}
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


async def wait_for_port(host: str, port: int, timeout_s: float,
                        process: ManagedProcess | None = None) -> None:
    """Wait until something accepts connections on host:port (or the process died)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            if process is not None and process.proc is not None and not process.running:
                raise RuntimeError(
                    f"{process.name} exited with {process.proc.returncode} before listening "
                    f"on {port}:\n{process.tail()}"
                ) from None
            if loop.time() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s") \
                    from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return

"""Provider simulators: fake Resend, SendGrid, SMTP, Twilio, FCM and OpenAI with fault injection.

    async with SimulatorServer(seed=1) as sim:
        ...  # point clients at sim.base_url / sim.smtp_host:sim.smtp_port

`SimulatorClient(base_url)` controls a simulator running in another process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulators.client import SimulatorClient, SimulatorControl
    from simulators.kinds import FaultKind, Provider
    from simulators.server import SimulatorServer
    from simulators.validation import ControlError

# Imported on first use: ``python -m simulators`` imports this package before its command can
# handle SIGTERM or Ctrl-C, and the server's modules (aiohttp and every provider) took a fifth
# of a second, in which a stop killed the process or ended in a KeyboardInterrupt traceback.
_MODULES = {
    "ControlError": "simulators.validation",
    "FaultKind": "simulators.kinds",
    "Provider": "simulators.kinds",
    "SimulatorClient": "simulators.client",
    "SimulatorControl": "simulators.client",
    "SimulatorServer": "simulators.server",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'simulators' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ControlError",
    "FaultKind",
    "Provider",
    "SimulatorClient",
    "SimulatorControl",
    "SimulatorServer",
]

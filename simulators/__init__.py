"""Provider simulators: fake Resend, SendGrid, SMTP, Twilio, FCM and OpenAI with fault injection.

    async with SimulatorServer(seed=1) as sim:
        ...  # point clients at sim.base_url / sim.smtp_host:sim.smtp_port

`SimulatorClient(base_url)` controls a simulator running in another process.
"""

from __future__ import annotations

from simulators.client import SimulatorClient, SimulatorControl
from simulators.kinds import FaultKind, Provider
from simulators.server import SimulatorServer
from simulators.validation import ControlError

__all__ = [
    "ControlError",
    "FaultKind",
    "Provider",
    "SimulatorClient",
    "SimulatorControl",
    "SimulatorServer",
]

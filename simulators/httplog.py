"""aiohttp's server logs a request it cannot parse (a header or URL over 8 KB, a NUL in a
header) as an ERROR with a traceback, although the simulator has answered it with a 400 and
did nothing wrong (see ``answer_refusal`` in app.py). So it logs a body it cannot read (chunked
framing that breaks off): the handler has answered 400, then aiohttp reads the rest of the body
to keep the connection and meets the same error again. notifkit's :func:`quiet_refusals`
makes each one WARNING line naming the problem, so a fuzzing CI job or a staging load does not
fill the simulator's log with tracebacks. (Content codings are the simulator's own to decode,
see bodies.py, and it logs their failures itself.)

The simulators' HTTP server logs through a logger of its own (:data:`SERVER_LOG`), so the
filter leaves alone any other aiohttp server in the same process (a test's, an application's).
"""

from __future__ import annotations

import logging

from notifkit.refusals import quiet_refusals

SERVER_LOG = logging.getLogger("simulators.http")


def quiet_unparseable_requests() -> logging.Logger:
    """:data:`SERVER_LOG` with the filter installed (once), for the server to log through."""
    return quiet_refusals(SERVER_LOG)

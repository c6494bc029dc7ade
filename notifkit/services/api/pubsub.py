"""One Redis pub/sub connection per API process: key revocations, template deletions and
in-app inbox messages.

The hub subscribes to ``Keys.key_revocations`` (dropping revoked keys from the
:class:`~notifkit.services.api.auth.KeyCache`), to ``Keys.template_deletions`` (so no process
goes on accepting sends of a deleted template it remembers) and to the pattern of every inbox
channel, handing each inbox message to the server-sent-event streams of that user open in this
process. One pattern subscription instead of one channel per open stream keeps it to a single
connection whatever the number of streams.

While the subscription is down the key cache is marked not live (every request checks
PostgreSQL) and cleared, and the open inbox streams are ended, because a revocation published
meanwhile would be missed. The templates the process remembers are forgotten when it is back:
a deletion published meanwhile was missed too (until then each is remembered for at most
``KNOWN_TEMPLATE_TTL_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.keys import Keys
from notifkit.services.api.admission import Admission
from notifkit.services.api.auth import KeyCache

log = logging.getLogger("notifkit.api.pubsub")

RECONNECT_DELAY_S = 0.5
MAX_RECONNECT_DELAY_S = 5.0
QUEUE_SIZE = 256  # messages an inbox stream may fall behind by before it is ended
# Put on a stream's queue to end it: shutdown, its key revoked, its user erased, or it fell
# behind. Published on a user's inbox channel, it ends that user's streams in every process.
CLOSE = b""


class Hub:
    def __init__(self, redis: Redis, keys: Keys, key_cache: KeyCache,
                 admission: Admission) -> None:
        self.redis = redis
        self.keys = keys
        self.key_cache = key_cache
        self.admission = admission
        self.live = asyncio.Event()
        self._listeners: dict[str, set[asyncio.Queue[bytes]]] = defaultdict(set)
        # The open streams of each project key, so revoking the key ends them: a stream
        # opened before the revocation must not go on delivering the user's messages.
        self._by_key: dict[str, set[asyncio.Queue[bytes]]] = defaultdict(set)
        self._inbox_pattern = keys.inbox_channel("*", "*")

    # -- revocations ---------------------------------------------------------------------
    async def publish_revocation(self, key_hash: str, key_id: str) -> None:
        self.key_cache.drop(key_hash)  # this process at once, the others via the channel
        await self.redis.publish(
            self.keys.key_revocations, codec.dumps({"keyHash": key_hash, "keyId": key_id})
        )

    # -- template deletions --------------------------------------------------------------
    async def publish_template_deletion(self, project_id: str, template_id: str) -> None:
        self.admission.forget_template(project_id, template_id)  # this process at once
        await self.redis.publish(
            self.keys.template_deletions,
            codec.dumps({"projectId": project_id, "templateId": template_id}),
        )

    # -- inbox streams -------------------------------------------------------------------
    def listen(self, project_id: str, user_id: str,
               key_id: str | None = None) -> asyncio.Queue[bytes]:
        # One slot more than the messages it holds: room for the end of the stream.
        queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_SIZE + 1)
        self._listeners[self.keys.inbox_channel(project_id, user_id)].add(queue)
        if key_id is not None:
            self._by_key[key_id].add(queue)
        return queue

    def unlisten(self, project_id: str, user_id: str, queue: asyncio.Queue[bytes],
                 key_id: str | None = None) -> None:
        _discard(self._listeners, self.keys.inbox_channel(project_id, user_id), queue)
        if key_id is not None:
            _discard(self._by_key, key_id, queue)

    async def end_user_streams(self, project_id: str, user_id: str) -> None:
        """End every open inbox stream of a user just erased, in every API process: an
        empty message on the user's channel, which each process's streams take as their
        end. Else a stream would go on with the messages of a user created again under the
        id (a token made for the erased user is refused from then on; inbox_token.py)."""
        await self.redis.publish(self.keys.inbox_channel(project_id, user_id), CLOSE)

    def close_streams(self) -> None:
        """Tell every open inbox stream to end (an empty message): the server is stopping."""
        for queues in list(self._listeners.values()):
            for queue in list(queues):
                _close(queue)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        delay_s = RECONNECT_DELAY_S
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.keys.key_revocations, self.keys.template_deletions)
                await pubsub.psubscribe(self._inbox_pattern)
                delay_s = RECONNECT_DELAY_S
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._handle(message)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("The pub/sub connection failed (%s); API keys are checked against "
                            "PostgreSQL until it is back. Reconnecting in %.1f s.", exc,
                            delay_s)
            except Exception:
                log.exception("The pub/sub loop failed unexpectedly; reconnecting in %.1f s.",
                              delay_s)
            finally:
                self._down()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, MAX_RECONNECT_DELAY_S)

    def _down(self) -> None:
        self.live.clear()
        self.key_cache.live = False
        self.key_cache.clear()
        # The open inbox streams would miss what is published meanwhile, a revocation of the
        # key that opened them included: they end, and the clients' reconnects authenticate
        # again (against PostgreSQL until the subscription is back).
        self.close_streams()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if kind in ("subscribe", "psubscribe"):
            # Live once both subscriptions are confirmed; only then is the cache trustworthy.
            if kind == "psubscribe":
                self.key_cache.clear()
                self.key_cache.live = True
                self.admission.forget_templates()
                self.live.set()
            return
        data = message.get("data")
        if not isinstance(data, bytes | str):
            return
        raw = data.encode() if isinstance(data, str) else data
        if kind == "message" and channel == self.keys.key_revocations:
            self._revoke(raw)
        elif kind == "message" and channel == self.keys.template_deletions:
            self._forget_template(raw)
        elif kind == "pmessage":
            for queue in list(self._listeners.get(channel, ())):
                if queue.qsize() < QUEUE_SIZE:
                    queue.put_nowait(raw)
                elif not queue.full():
                    # Dropping messages would leave a gap the client cannot see. The stream
                    # ends after what it holds; the client reconnects with the last id it
                    # got and is sent the rest from PostgreSQL (the stream's resume).
                    log.warning("An inbox stream is not keeping up; ending it after the "
                                "%d messages it holds, for its client to resume.", QUEUE_SIZE)
                    queue.put_nowait(CLOSE)
                # else: ending already; the client resumes what comes now

    def _revoke(self, raw: bytes) -> None:
        try:
            payload = codec.loads(raw)
            key_hash = payload["keyHash"]
        except (ValueError, TypeError, KeyError):
            log.warning("Ignoring a malformed key revocation; clearing the key cache instead.")
            self.key_cache.clear()
            return
        if isinstance(key_hash, str):
            self.key_cache.drop(key_hash)
        key_id = payload.get("keyId") if isinstance(payload, dict) else None
        for queue in list(self._by_key.get(key_id, ())) if isinstance(key_id, str) else ():
            _close(queue)

    def _forget_template(self, raw: bytes) -> None:
        try:
            payload = codec.loads(raw)
            project_id, template_id = payload["projectId"], payload["templateId"]
        except (ValueError, TypeError, KeyError):
            project_id = template_id = None
        if isinstance(project_id, str) and isinstance(template_id, str):
            self.admission.forget_template(project_id, template_id)
        else:
            log.warning("Ignoring a malformed template deletion; forgetting every template "
                        "instead.")
            self.admission.forget_templates()


def _close(queue: asyncio.Queue[bytes]) -> None:
    """End a stream: an empty message, making room for it if the queue is full."""
    with contextlib.suppress(asyncio.QueueEmpty):
        if queue.full():
            queue.get_nowait()
    queue.put_nowait(CLOSE)


def _discard(index: dict[str, set[asyncio.Queue[bytes]]], name: str,
             queue: asyncio.Queue[bytes]) -> None:
    queues = index.get(name)
    if queues is not None:
        queues.discard(queue)
        if not queues:
            del index[name]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""

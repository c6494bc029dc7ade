"""``lock:workflow:{instanceId}``: one runner per instance, anywhere in the fleet.

Taken with ``SET NX PX`` and a random token, renewed every third of its TTL while the runner
works, and released or renewed only by the holder (compare-and-delete / compare-and-pexpire in
Lua), so a runner that stalled past its TTL can never free a lock someone else now holds. A
runner that fails to renew marks the lock ``lost`` and stops before its next step.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from redis.asyncio import Redis
from redis.exceptions import RedisError

from notifkit.tasks import cancel_and_wait

log = logging.getLogger("notifkit.workflow")

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class InstanceLocks:
    def __init__(self, redis: Redis, ttl_ms: int, *, exclusive: bool = True) -> None:
        self.redis = redis
        self.ttl_ms = ttl_ms
        self.exclusive = exclusive  # False only for a test-only fault (ignore_workflow_locks)
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)

    async def acquire(self, key: str) -> HeldLock | None:
        token = secrets.token_hex(16)
        if not await self.redis.set(key, token, nx=self.exclusive, px=self.ttl_ms):
            return None
        held = HeldLock(self, key, token)
        held.start()
        return held


class HeldLock:
    def __init__(self, locks: InstanceLocks, key: str, token: str) -> None:
        self.locks = locks
        self.key = key
        self.token = token
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._renewer = asyncio.create_task(self._renew_loop(), name=f"renew {self.key}")

    async def _renew_loop(self) -> None:
        interval_s = self.locks.ttl_ms / 3000
        while True:
            await asyncio.sleep(interval_s)
            try:
                renewed = await self.locks._renew(
                    keys=[self.key], args=[self.token, self.locks.ttl_ms]
                )
            except RedisError as exc:
                log.warning("Renewing %s failed (%s); trying again.", self.key, exc)
                continue
            if not renewed:
                self.lost = True
                log.warning("Lost %s to another runner; this runner stops before its next "
                            "step and the instance carries on there.", self.key)
                return

    async def release(self) -> None:
        if self._renewer is not None:
            # Cancelled again until it ends: a cancellation landing as a renewal's call
            # completes can be swallowed (asyncio.wait_for on Python 3.11), and the renewer
            # would go on holding the lock while this waited for it.
            await cancel_and_wait(self._renewer)
        if not self.lost:
            await self.locks._release(keys=[self.key], args=[self.token])

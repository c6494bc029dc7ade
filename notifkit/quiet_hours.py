"""Quiet hours: when a user's daily quiet period ends, as a UTC instant. Pure functions.

A quiet period is a pair of wall-clock times in the user's IANA timezone, ``start`` inclusive,
``end`` exclusive. ``end < start`` wraps midnight (22:00 to 07:00); ``start == end`` is no
quiet period at all. Wall-clock semantics decide everything, so the period follows DST:

- 22:00-07:00 in Europe/Berlin on the night of 2026-03-29 lasts 8 hours (21:00Z to 05:00Z),
  and in America/New_York on the night of 2026-11-01 it lasts 10 (02:00Z to 12:00Z).
- An ``end`` that falls in a spring-forward gap (02:30 in Berlin on 2026-03-29) ends the period
  at the transition, the first instant the clock shows a time past it; unless ``start`` was
  skipped too (02:45-02:30): the clock then never leaves quiet hours that night, and the period
  runs on to the next day's ``end``.
- An ``end`` that happens twice in a fall-back hour ends the period at the next occurrence
  after ``now``.
- A fall-back that sets the clock back before ``start`` (02:40 CEST to 02:00 CET, in a period
  from 02:30) ends the period at the transition; it begins again when the clock next shows
  ``start``.

The engine decides who bypasses quiet hours (critical sends); this module only tells the time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

log = logging.getLogger("notifkit.quiet_hours")

_ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class QuietHours:
    start: time
    end: time

    @classmethod
    def parse(cls, value: QuietHours | Mapping[str, Any] | None) -> QuietHours | None:
        """From the API's ``{"start": "22:00", "end": "07:00"}`` (or ``time`` values, as a
        ``quiet_hours`` row gives them); None when there is no quiet period."""
        if value is None or isinstance(value, QuietHours):
            return value
        start, end = value.get("start"), value.get("end")
        if start is None or end is None:
            return None
        return cls(parse_time(start), parse_time(end))

    def contains(self, wall: time) -> bool:
        """Whether the wall-clock time ``wall`` lies inside the quiet period."""
        if self.start == self.end:
            return False
        if self.start < self.end:
            return self.start <= wall < self.end
        return wall >= self.start or wall < self.end


def wall_time(value: time) -> str:
    """A quiet-hours time as the API takes it: HH:MM, or HH:MM:SS when it has seconds."""
    return value.strftime("%H:%M:%S" if value.second else "%H:%M")


def deferred_for(prefs: QuietHours | Mapping[str, Any] | None,
                 tz: str | None) -> tuple[str, str]:
    """How a timeline row says a send waits for quiet hours, and the zone they were read in
    (a user without a known timezone is held by UTC quiet hours, which only this says)."""
    quiet = QuietHours.parse(prefs)
    where = zone(tz).key
    hours = "" if quiet is None else f"{wall_time(quiet.start)}-{wall_time(quiet.end)} "
    return f"deferred for quiet hours ({hours}{where})", where


def parse_time(value: object) -> time:
    """A quiet-hours time from HH:MM, HH:MM:SS or a ``time``."""
    if isinstance(value, time):
        return value.replace(tzinfo=None, microsecond=0)
    if isinstance(value, str):
        parts = value.strip().split(":")
        if 2 <= len(parts) <= 3 and all(p.isascii() and p.isdigit() for p in parts):
            hour, minute, second = (int(p) for p in [*parts, "0"][:3])
            try:
                return time(hour, minute, second)
            except ValueError:
                pass
    raise ValueError(f"a quiet-hours time must be HH:MM or HH:MM:SS, got {value!r}")


@lru_cache(maxsize=1024)
def zone(name: str | None) -> ZoneInfo:
    """The user's zone; UTC when none is set (users.timezone NULL) or the name is unknown."""
    if not name:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("Unknown timezone %r; using UTC for quiet hours.", name)
        return ZoneInfo("UTC")


def deferral(
    prefs: QuietHours | Mapping[str, Any] | None, tz: str | None, now: datetime
) -> datetime | None:
    """None when ``now`` is outside the quiet period, else the UTC instant it ends.

    ``prefs`` is the user's quiet period (or None), ``tz`` their IANA timezone (None = UTC),
    ``now`` an aware datetime.
    """
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    quiet = QuietHours.parse(prefs)
    if quiet is None:
        return None
    try:
        return _deferral(quiet, zone(tz), now)
    except OverflowError:
        # A sendAt on the calendar's last day (the API takes up to 9999-12-31T23:59:59.999Z):
        # the local date or the period's end lies past what datetime can show. Wait until the
        # last millisecond it can: never early, and never an error the engine retries forever.
        return _LAST_INSTANT


# The last millisecond a due time can hold (due times are whole milliseconds, clock.to_ms).
_LAST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)


def _deferral(quiet: QuietHours, where: ZoneInfo, now: datetime) -> datetime | None:
    local = now.astimezone(where)
    if not quiet.contains(local.time().replace(tzinfo=None)):
        return None
    now_utc = now.astimezone(UTC)
    # The period ends today (now is before `end`) or tomorrow (it wrapped midnight). Taking the
    # first occurrence after now covers both, and a fall-back hour that repeats `end`. An `end`
    # skipped by a spring-forward gap is passed at the transition, where the clock may show a
    # time past `start` as well (both inside the gap): the next period has begun at the same
    # instant, the clock never left quiet hours, and the period runs on to the next `end`.
    for days in (0, 1, 2):  # a next day only when needed (9999-12-31 has no next)
        for instant in wall_instants(local.date() + timedelta(days=days), quiet.end, where):
            if instant > now_utc and not quiet.contains(_wall(instant, where)):
                return _turned_back_out(quiet, where, now_utc, instant) or instant
    raise AssertionError("a quiet period ends within three local days")  # pragma: no cover


def _turned_back_out(quiet: QuietHours, where: ZoneInfo, now: datetime,
                     until: datetime) -> datetime | None:
    """A fall-back before ``until`` that sets the clock back to a time before ``start`` (02:40
    CEST to 02:00 CET, in a period from 02:30): quiet hours end there, not at ``end``."""
    if now.astimezone(where).utcoffset() == until.astimezone(where).utcoffset():
        return None  # no transition in between (zones change offset at most once in 48 h)
    step = timedelta(hours=1)
    lo = now
    while lo < until:
        hi = min(lo + step, until)
        if lo.astimezone(where).utcoffset() != hi.astimezone(where).utcoffset():
            change = _transition(lo, hi, where)
            if change < until and not quiet.contains(_wall(change, where)):
                return change
        lo = hi
    return None


def _wall(instant: datetime, where: ZoneInfo) -> time:
    return instant.astimezone(where).time().replace(tzinfo=None)


def wall_instants(day: date, wall: time, where: ZoneInfo) -> list[datetime]:
    """The UTC instants at which the clock in ``where`` reaches ``wall`` on ``day``, in order.

    Usually one; two in a fall-back hour; in a spring-forward gap the wall time never shows,
    and the clock passes it at the transition, which is returned instead.
    """
    naive = datetime.combine(day, wall)
    first = naive.replace(tzinfo=where, fold=0).astimezone(UTC)
    second = naive.replace(tzinfo=where, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if first < second:  # ambiguous: fold=0 is the earlier offset's reading
        return [first, second]
    # A gap: fold=0 reads the wall time with the offset before the transition, fold=1 with the
    # one after, so the transition lies between `second` and `first`.
    return [_transition(second, first, where)]


def _transition(before: datetime, after: datetime, where: ZoneInfo) -> datetime:
    """The first whole second in (before, after] whose UTC offset differs from ``before``'s."""
    offset = before.astimezone(where).utcoffset()
    lo, hi = before, after
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) / 2
        mid = mid.replace(microsecond=0)
        if mid <= lo:
            mid = lo + _ONE_SECOND
        if mid.astimezone(where).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return hi

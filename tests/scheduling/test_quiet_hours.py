"""Quiet hours end at the right instant, across DST changes in two timezones."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifkit.quiet_hours import QuietHours, deferral, wall_instants, zone

NIGHT = {"start": "22:00", "end": "07:00"}


def is_quiet(prefs: QuietHours | dict[str, Any] | None, tz: str | None, now: datetime) -> bool:
    return deferral(prefs, tz, now) is not None


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
        second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# -- Europe/Berlin, spring forward on 2026-03-29 (02:00 CET -> 03:00 CEST) -----------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 28, 20, 59), None),  # 21:59 CET, before the period
        (utc(2026, 3, 28, 21, 0), utc(2026, 3, 29, 5, 0)),  # 22:00 CET, it starts
        (utc(2026, 3, 28, 23, 0), utc(2026, 3, 29, 5, 0)),  # midnight
        (utc(2026, 3, 29, 0, 59), utc(2026, 3, 29, 5, 0)),  # 01:59 CET, just before the jump
        (utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 5, 0)),  # 03:00 CEST, just after it
        (utc(2026, 3, 29, 4, 59, 59), utc(2026, 3, 29, 5, 0)),
        (utc(2026, 3, 29, 5, 0), None),  # 07:00 CEST: over, 8 hours after it began
    ],
)
def test_berlin_spring_forward_night_ends_at_seven_summer_time(
    now: datetime, expected: datetime | None
) -> None:
    assert deferral(NIGHT, "Europe/Berlin", now) == expected


# -- America/New_York, fall back on 2026-11-01 (02:00 EDT -> 01:00 EST) --------------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 11, 1, 1, 59), None),  # 21:59 EDT
        (utc(2026, 11, 1, 2, 0), utc(2026, 11, 1, 12, 0)),  # 22:00 EDT
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 12, 0)),  # 01:30 EDT, first pass
        (utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 12, 0)),  # 01:30 EST, second pass
        (utc(2026, 11, 1, 11, 0), utc(2026, 11, 1, 12, 0)),  # 06:00 EST; naive +offset says 11:00Z
        (utc(2026, 11, 1, 12, 0), None),  # 07:00 EST: over, 10 hours after it began
    ],
)
def test_new_york_fall_back_night_ends_at_seven_standard_time(
    now: datetime, expected: datetime | None
) -> None:
    assert deferral(NIGHT, "America/New_York", now) == expected


def test_the_other_direction_in_each_zone() -> None:
    # Berlin falls back on 2026-10-25, New York springs forward on 2026-03-08.
    assert deferral(NIGHT, "Europe/Berlin", utc(2026, 10, 24, 23, 0)) == utc(2026, 10, 25, 6, 0)
    assert deferral(NIGHT, "America/New_York", utc(2026, 3, 8, 5, 0)) == utc(2026, 3, 8, 11, 0)


def test_an_end_inside_the_spring_forward_gap_ends_at_the_transition() -> None:
    # 02:30 never shows in Berlin on 2026-03-29: the clock passes it at 01:00Z (02:00 -> 03:00).
    quiet = {"start": "01:00", "end": "02:30"}
    assert deferral(quiet, "Europe/Berlin", utc(2026, 3, 29, 0, 15)) == utc(2026, 3, 29, 1, 0)
    assert deferral(quiet, "Europe/Berlin", utc(2026, 3, 29, 1, 0)) is None  # 03:00 CEST


@pytest.mark.parametrize(("quiet", "tz", "now", "expected"), [
    # 02:30 and 02:45 both fall in Berlin's skipped hour on 2026-03-29: the clock jumps from
    # 01:59 CET, quiet, to 03:00 CEST, quiet again, so the period runs on to the next 02:30.
    ({"start": "02:45", "end": "02:30"}, "Europe/Berlin", utc(2026, 3, 28, 12, 41),
     utc(2026, 3, 30, 0, 30)),
    ({"start": "03:00", "end": "02:15"}, "Europe/Berlin", utc(2026, 3, 29, 0, 30),
     utc(2026, 3, 30, 0, 15)),
    # New York skips 02:00-03:00 on 2026-03-08.
    ({"start": "02:30", "end": "02:15"}, "America/New_York", utc(2026, 3, 7, 16, 23),
     utc(2026, 3, 9, 6, 15)),
    # Lord Howe's clock skips half an hour (02:00 -> 02:30) on 2026-10-04.
    ({"start": "02:15", "end": "02:00"}, "Australia/Lord_Howe", utc(2026, 10, 3, 6, 7),
     utc(2026, 10, 4, 15, 0)),
])
def test_a_period_that_ends_and_starts_again_inside_a_skipped_hour_runs_on(
    quiet: dict[str, str], tz: str, now: datetime, expected: datetime
) -> None:
    """The transition ends the period and begins the next at the same instant: the user's
    clock never leaves quiet hours, so a deferred send must not leave at the transition."""
    assert deferral(quiet, tz, now) == expected
    assert is_quiet(quiet, tz, expected - timedelta(seconds=1))
    assert not is_quiet(quiet, tz, expected)


def test_an_end_that_happens_twice_ends_at_the_next_occurrence() -> None:
    quiet = {"start": "00:30", "end": "01:30"}
    # 01:10 EDT: ends at the first 01:30 (EDT, 05:30Z).
    assert deferral(quiet, "America/New_York", utc(2026, 11, 1, 5, 10)) == utc(2026, 11, 1, 5, 30)
    # 01:10 EST: the clock shows a quiet time again; it ends at the second 01:30 (06:30Z).
    assert deferral(quiet, "America/New_York", utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 1, 6, 30)


@pytest.mark.parametrize("end", ["03:30", "07:00"])
def test_a_fall_back_that_turns_the_clock_back_out_of_quiet_hours_ends_them(end: str) -> None:
    """Berlin falls back on 2026-10-25 from 03:00 CEST to 02:00 CET (01:00Z). At 02:40 CEST a
    period starting at 02:30 is on, but the clock then shows 02:00, before its start: quiet
    hours end at the transition, not at the next `end`, and begin again at 02:30 CET."""
    quiet = {"start": "02:30", "end": end}
    assert deferral(quiet, "Europe/Berlin", utc(2026, 10, 25, 0, 40)) == utc(2026, 10, 25, 1)
    assert not is_quiet(quiet, "Europe/Berlin", utc(2026, 10, 25, 1))
    # Back in them once the repeated hour reaches 02:30 again: the period's own end then.
    later = {"03:30": utc(2026, 10, 25, 2, 30), "07:00": utc(2026, 10, 25, 6)}[end]
    assert deferral(quiet, "Europe/Berlin", utc(2026, 10, 25, 1, 30)) == later


def test_a_period_within_one_day_and_the_degenerate_ones() -> None:
    lunch = {"start": "12:00", "end": "13:30"}
    assert deferral(lunch, None, utc(2026, 6, 1, 12, 15)) == utc(2026, 6, 1, 13, 30)
    assert deferral(lunch, None, utc(2026, 6, 1, 13, 30)) is None
    assert deferral(lunch, None, utc(2026, 6, 1, 11, 59)) is None
    assert deferral({"start": "09:00", "end": "09:00"}, "Europe/Berlin", utc(2026, 6, 1, 7)) is None
    assert deferral(None, "Europe/Berlin", utc(2026, 6, 1, 23)) is None
    assert deferral({"start": None, "end": "07:00"}, None, utc(2026, 6, 1, 23)) is None


def test_rows_from_the_database_and_unknown_zones() -> None:
    row = QuietHours(time(22, 0), time(7, 0))
    assert deferral(row, "Not/AZone", utc(2026, 6, 1, 23)) == utc(2026, 6, 2, 7)  # UTC
    assert is_quiet(row, "Asia/Tokyo", utc(2026, 6, 1, 14))  # 23:00 JST
    with pytest.raises(ValueError, match="aware"):
        deferral(row, None, datetime(2026, 6, 1, 23))
    with pytest.raises(ValueError, match="HH:MM"):
        QuietHours.parse({"start": "25:00", "end": "07:00"})


@pytest.mark.parametrize("name", ["../etc/localtime", "/UTC", "Europe/../UTC", "Europe/Berlin\x00"])
def test_a_zone_name_zoneinfo_refuses_as_a_path_is_read_as_utc(name: str) -> None:
    # ZoneInfo raises ValueError, not ZoneInfoNotFoundError, for a name shaped like a path:
    # the user's stored timezone must not fail every send of theirs on it.
    assert zone(name).key == "UTC"
    assert deferral(QuietHours(time(22, 0), time(7, 0)), name, utc(2026, 6, 1, 23)) \
        == utc(2026, 6, 2, 7)


@pytest.mark.parametrize("spelling", ["22", "22:00:00:00", "\uff12\uff12:00", "22:0\u00b2"])
def test_a_quiet_hours_time_is_hh_mm_or_hh_mm_ss_in_ascii_digits(spelling: str) -> None:
    # Two or three fields, each of ASCII digits: int() reads other scripts' digits, and a
    # fourth field was dropped unread ("22:00:00:99" read as 22:00).
    with pytest.raises(ValueError, match="must be HH:MM or HH:MM:SS"):
        QuietHours.parse({"start": spelling, "end": "07:00"})


def test_a_time_with_microseconds_is_read_to_the_second_as_it_is_shown() -> None:
    # A period is shown (and compared) to the second; a stored time carrying microseconds
    # would start half a second later than the time the timeline names.
    quiet = QuietHours.parse({"start": time(22, 0, 0, 500_000), "end": time(7, 0, 0, 1)})
    assert quiet == QuietHours(time(22, 0), time(7, 0))
    assert is_quiet(quiet, None, utc(2026, 6, 1, 22, 0) + timedelta(microseconds=200_000))


def test_a_send_due_on_the_calendars_last_day_is_deferred_not_crashed_on() -> None:
    """The API takes any sendAt up to 9999-12-31T23:59:59.999Z. A period that ends, or a
    local date that lies, past the last day datetime can show waits until the calendar's
    last millisecond: never early (it said ...59.000 for a send due at ...59.999), and the
    engine never fails the send on every retry."""
    last = utc(9999, 12, 31, 23, 59, 59) + timedelta(milliseconds=999)
    assert deferral(NIGHT, "UTC", last) == last
    assert deferral(NIGHT, "UTC", utc(9999, 12, 31, 23, 30)) == last
    assert deferral(NIGHT, "Asia/Tokyo", utc(9999, 12, 31, 14, 0)) == last  # 23:00 JST
    assert deferral(NIGHT, "Asia/Tokyo", utc(9999, 12, 31, 16, 0)) == last  # 01:00, year 10000
    assert deferral(NIGHT, "America/New_York", utc(9999, 12, 31, 23, 30)) is None  # 18:30
    assert deferral(NIGHT, "UTC", utc(9999, 12, 31, 6, 0)) == utc(9999, 12, 31, 7, 0)


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
# DST days of those zones in 2026, so the examples cluster where the rules bite.
DST_DAYS = [utc(2026, 3, 29), utc(2026, 10, 25), utc(2026, 3, 8), utc(2026, 11, 1),
            utc(2026, 4, 5), utc(2026, 10, 4)]
times = st.builds(time, st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))
instants = st.one_of(
    st.datetimes(datetime(2025, 1, 1), datetime(2028, 1, 1), timezones=st.just(UTC)),
    st.builds(
        lambda day, seconds: day + timedelta(seconds=seconds),
        st.sampled_from(DST_DAYS),
        st.integers(-36 * 3600, 36 * 3600),
    ),
)


@given(start=times, end=times, tz=st.sampled_from(ZONES), now=instants)
def test_deferral_ends_exactly_when_the_quiet_period_ends(
    start: time, end: time, tz: str, now: datetime
) -> None:
    """Whatever the zone and its DST rules (Lord Howe shifts by 30 minutes): a send deferred
    leaves at the first instant the user's clock is out of quiet hours, never earlier, never
    later. A period is shorter than a day, but one whose end and next start a spring-forward
    gap both skips joins the next one."""
    quiet = QuietHours(start, end)
    where = zone(tz)

    def quiet_at(instant: datetime) -> bool:
        return quiet.contains(instant.astimezone(where).time().replace(tzinfo=None))

    until = deferral(quiet, tz, now)
    if until is None:
        assert not quiet_at(now)
        return
    assert quiet_at(now)
    assert now < until <= now + timedelta(hours=48)
    assert not quiet_at(until)
    # Quiet all the way there: probe the second before and a spread of points in between.
    span = until - now
    for fraction in (0.0, 0.25, 0.5, 0.75):
        assert quiet_at(now + span * fraction)
    # Times lie on a 15-minute grid and so do these zones' transitions: a stretch out of quiet
    # hours (a fall-back to before `start`) lasts 15 minutes at least, and one probe lands in it.
    probe = now
    while probe < until:
        assert quiet_at(probe)
        probe += timedelta(minutes=15)
    if until - timedelta(seconds=1) >= now:
        assert quiet_at(until - timedelta(seconds=1))


def test_wall_instants_in_each_kind_of_day() -> None:
    berlin, new_york = zone("Europe/Berlin"), zone("America/New_York")
    assert wall_instants(utc(2026, 6, 1).date(), time(7), berlin) == [utc(2026, 6, 1, 5)]
    assert wall_instants(utc(2026, 3, 29).date(), time(2, 30), berlin) == [utc(2026, 3, 29, 1)]
    assert wall_instants(utc(2026, 11, 1).date(), time(1, 30), new_york) == [
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 1, 6, 30),
    ]

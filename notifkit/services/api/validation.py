"""Reading and validating request input. Every problem names its field.

:func:`read_json` enforces the transport rules (JSON media type, body size, a JSON object whose
values PostgreSQL and the stream codec can store). :class:`Fields` checks one object's fields
and collects every problem before raising, so a client fixes a request in one round trip.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import math
import re
import time
import uuid
import zlib
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from aiohttp import HttpVersion11, web
from yarl import URL

from notifkit import codec
from notifkit.destinations import ascii_domain, refused_host
from notifkit.inbox_token import QUERY_PARAM as INBOX_TOKEN
from notifkit.services.api.errors import (
    ApiError,
    Detail,
    body_too_large,
    detail,
    error_response,
    invalid,
    invalid_field,
    undecodable_body,
)
from notifkit.services.api.state import SETTINGS
from notifkit.text import (
    CONTROL_CHARS,
    CONTROL_CHARS_MESSAGE,
    has_control_chars,
    identifier_problem,
    is_utf8,
)

MAX_JSON_DEPTH = 32
# A key's closing quote and its colon: the text holds at least one per key it gives.
_KEY_END = re.compile(rb'"[ \t\r\n]*:')
_LONG_DIGITS = re.compile(rb"\d{19}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
JSON_TYPES = ("application/json",)

# RFC 3339 date-time; Python's fromisoformat alone accepts many non-RFC spellings (and reads
# an offset of +05:60 as +06:00). ASCII digits only, and \Z: `$` would let a newline through.
# A fraction has as many digits as the writer likes (time-secfrac = "." 1*DIGIT);
# fromisoformat keeps the microseconds of any length.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])\Z"
)
# \Z, not $: $ also matches before a final newline, which would pass "+4915112345678\n";
# [0-9], not \d, which takes any script's digits.
E164 = re.compile(r"^\+[1-9][0-9]{6,14}\Z")
# Deliberately simple: one @, no spaces, a dotted domain of DNS labels. Providers do the rest.
_EMAIL = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@"
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+\Z"
)
# A BCP 47 language tag (`de`, `zh-Hant-HK`, `en-US-u-ca-gregory`; `_` as POSIX locales write
# it), up to 35 characters, the length RFC 5646 asks every implementation to take.
_LOCALE = re.compile(r"^(?=.{2,35}\Z)[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8}){0,7}\Z")
# Seconds optional; ASCII digits only (\d takes any script's) and nothing after the time.
_HHMM = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?\Z")
# C0 and C1 control characters nowhere: for names (see notifkit/text.py).
NO_CONTROL_CHARS = re.compile(f"[^{CONTROL_CHARS}]*\\Z")


# ---------------------------------------------------------------------------------------------
# Bodies


# The charsets a JSON body may declare: UTF-8, and ASCII, which is a subset of it.
UTF8_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


def is_json_media_type(content_type: str) -> bool:
    return content_type in JSON_TYPES or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


# The content codings a request body may be in. The API decodes them itself (the app runs with
# aiohttp's auto_decompress off): aiohttp's own decoding runs inside its HTTP parser, where a
# coding it lacks (br, zstd) or a broken deflate stream is answered with a plain-text 400 that
# bypasses the error envelope, and a coding it does not know passes as if it were identity.
_ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
               "deflate": zlib.MAX_WBITS}


# How long a request body may go without a byte arriving before the API answers 408: a body
# that stalls (a chunked body never finished, a Content-Length never reached) would otherwise
# hold its connection and handler for ever.
BODY_IDLE_TIMEOUT_S = 30.0


# How often a body read looks for progress: the 408 comes at most this long after the limit.
BODY_POLL_S = 1.0
# The clock idle time is measured on (a test turns it faster).
_clock = time.monotonic


async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
    """The routes' answer to an ``Expect`` header, given before any middleware runs: 100
    Continue for a body the API will read, the envelope's 413 for one whose Content-Length is
    already over the limit (RFC 9110 lets a server refuse instead of inviting the body), and
    the envelope's 417 for an expectation other than 100-continue."""
    if request.version < HttpVersion11:
        return None  # HTTP/1.0 has no Expect; the body follows the headers unasked.
    expect = request.headers.get("Expect", "")
    if expect.strip().lower() != "100-continue":
        return error_response(ApiError(
            417, "expectation_failed",
            "The server meets no expectation but 100-continue; send the request without it.",
            [detail("Expect", "must be 100-continue")],
            # Whether the body follows anyway is the client's guess: not read as a request.
            headers={"Connection": "close"}))
    too_large = announced_too_large(request)
    if too_large is not None:
        return error_response(too_large)
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return None


def announced_too_large(request: web.Request) -> ApiError | None:
    """The 413 for a body whose Content-Length is over the limit, known before it is read."""
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return body_too_large(limit)
    return None


async def read_raw(request: web.Request) -> bytes:
    """``request.read()`` (aiohttp raises 413 past client_max_size), answering 408 once the
    body has made no progress for :data:`BODY_IDLE_TIMEOUT_S`, and 413 at once for a body
    announced over the limit (neither reading nor waiting for bytes that would be refused)."""
    too_large = announced_too_large(request)
    if too_large is not None:
        raise too_large
    reading = asyncio.ensure_future(request.read())
    # Idle time counts from the start of the read, so a body that stalls at once is refused
    # after the limit, not after a first window that would count as progress.
    received = request.content.total_bytes
    quiet_since = _clock()
    try:
        while True:
            done, _ = await asyncio.wait({reading}, timeout=BODY_POLL_S)
            if done:
                return reading.result()
            now = _clock()
            if request.content.total_bytes != received:
                received, quiet_since = request.content.total_bytes, now
            elif now - quiet_since >= BODY_IDLE_TIMEOUT_S:
                raise ApiError(
                    408, "request_timeout",
                    f"The request body stopped arriving: nothing came for "
                    f"{BODY_IDLE_TIMEOUT_S:g} s.",
                    [detail("body", "stopped arriving before its end")],
                    headers={"Connection": "close"})
    finally:
        if not reading.done():
            reading.cancel()
            with suppress(asyncio.CancelledError):
                await reading


async def read_body(request: web.Request) -> bytes:
    """The request body with its Content-Encoding undone: 415 for a coding other than gzip,
    deflate or identity, 400 for a body that does not decode, 413 past the size limit (on the
    bytes as sent and again once decoded, so a small compressed body cannot inflate without
    bound)."""
    raw = await read_raw(request)
    header = request.headers.get("Content-Encoding", "")
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    # Codings are listed in the order they were applied: undo them from the last.
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in _ZLIB_WBITS:
            raise ApiError(415, "unsupported_media_type",
                           f"The request body's Content-Encoding {coding!r} is not supported; "
                           "send it uncompressed, gzip or deflate.",
                           [detail("Content-Encoding", "must be gzip, deflate or identity")])
        raw = _inflate(raw, coding, request.app[SETTINGS].max_body_bytes)
    return raw


def _inflate(raw: bytes, coding: str, limit: int) -> bytes:
    if not raw:
        return raw
    wbits = _ZLIB_WBITS[coding]
    if coding == "deflate" and raw[0] & 0x0F != 8:
        # Many clients send raw deflate without the zlib header RFC 9110 asks for; aiohttp
        # accepts it too.
        wbits = -zlib.MAX_WBITS
    out = b""
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            # At most one byte past the limit: enough to tell it was passed.
            out += inflater.decompress(raw, limit + 1 - len(out))
        except zlib.error:
            raise undecodable_body() from None
        if len(out) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(out))
        if not inflater.eof:
            raise undecodable_body()  # cut short
        raw = inflater.unused_data
        if not raw:
            return out
        if wbits != _ZLIB_WBITS["gzip"]:
            raise undecodable_body()  # bytes after the end of a deflate stream
        # RFC 1952: a gzip body may be several members back to back (pigz, concatenated
        # files); it decodes to their contents in order.


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or the contract's 413 / 415 / 400."""
    raw = await read_body(request)
    if not is_json_media_type(request.content_type):
        raise unsupported_media_type()
    charset = request.charset
    if charset and charset.lower() not in UTF8_CHARSETS:
        # JSON is UTF-8 (RFC 8259). Read as UTF-8 regardless, a body in another charset is
        # either refused as bytes that do not decode or, worse, read as other text than sent.
        raise ApiError(415, "unsupported_media_type",
                       "Send the request body as application/json in UTF-8.",
                       [detail("Content-Type", f"must be UTF-8, not charset={charset}")])
    return parse_json_object(raw)


def unsupported_media_type() -> ApiError:
    message = "Send the request body as application/json."
    return ApiError(415, "unsupported_media_type", message,
                    [detail("Content-Type", "must be application/json")])


def invalid_json(message: str) -> ApiError:
    """A body that is not the JSON the route takes: 400 naming ``body``."""
    return ApiError(400, "invalid_json", message, [detail("body", message)])


def load_json(raw: bytes) -> Any:
    """Any JSON value, its numbers exact (for check_storable to judge); 400 on ``body`` for
    what is not JSON."""
    try:
        value = codec.loads(raw)
        if _LONG_DIGITS.search(raw):
            # orjson reads an integer beyond 64 bits as a float, silently rounded; the standard
            # parser keeps it exact so check_storable refuses it instead. Only bodies with a
            # run of 19+ digits (in a number or a string) take this slower path.
            value = json.loads(raw)
    except (ValueError, TypeError, RecursionError) as exc:
        value = _lenient_loads(raw, exc)
    return value


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise invalid_json("The request body is empty; send a JSON object.")
    value = load_json(raw)
    if not isinstance(value, dict):
        raise invalid_json("The request body must be a JSON object.")
    problems: list[Detail] = []
    keys = check_storable(value, "", problems)
    if problems:
        raise invalid(problems)
    repeated = repeated_key(raw, keys)
    if repeated is not None:
        # Which of the two the caller meant is a guess (a parser keeps the last, a proxy or
        # a log reader may show the first): refused, as a header or parameter sent twice is.
        raise invalid([detail("body", f"gives the key {repeated!r} more than once in one "
                                      "object; send each field once")])
    return value


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def repeated_key(raw: bytes, keys: int) -> str | None:
    """A key ``raw`` gives twice in one object, or None; ``keys`` is how many it holds once
    parsed (a repeated key is kept once). Every key in the text ends in a quote and a colon, so
    when there are no more of those than ``keys`` none was repeated; only otherwise (a string
    holding ``":``: escaped JSON is full of them) is the text read again, key by key, which
    costs about what parsing it did."""
    if len(_KEY_END.findall(raw)) <= keys:
        return None
    try:
        json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_pairs)
    except _RepeatedKey as found:
        return found.key[:100]
    except (ValueError, RecursionError):  # read by orjson alone: nothing to say about keys
        return None
    return None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return value



def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _lenient_loads(raw: bytes, orjson_error: Exception) -> Any:
    """The body orjson refused, read by the standard parser: orjson also refuses valid JSON it
    cannot represent (a number beyond a double such as 1e400, an escaped lone surrogate), and
    those are better answered by check_storable naming the field than by a 400 on ``body``.
    What is not JSON (NaN, bytes that are not UTF-8) stays a 400 on ``body``."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError):
        raise invalid_json(f"The request body is not valid JSON: {orjson_error}.") from None


def check_storable(value: Any, path: str, problems: list[Detail], depth: int = 0) -> int:
    """Flag what PostgreSQL's jsonb or the stream codec cannot hold: NUL characters, integers
    beyond 64 bits, non-finite numbers, and nesting deeper than :data:`MAX_JSON_DEPTH`. Returns
    how many object keys ``value`` holds, nested ones included (for :func:`repeated_key`)."""
    if len(problems) >= 20:
        return 0
    where = path or "body"
    if depth > MAX_JSON_DEPTH:
        problems.append(detail(where, f"is nested deeper than {MAX_JSON_DEPTH} levels"))
        return 0
    if isinstance(value, str):
        if "\x00" in value:
            problems.append(detail(where, "must not contain NUL characters"))
        elif not value.isascii() and not is_utf8(value):
            problems.append(detail(where, "must be valid Unicode (no lone surrogates)"))
    elif isinstance(value, bool) or value is None:
        return 0
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            problems.append(detail(where, "is outside the 64-bit integer range"))
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append(detail(where, "must be a finite number"))
    elif isinstance(value, dict):
        keys = len(value)
        for key, item in value.items():
            if "\x00" in key or not is_utf8(key):
                problems.append(detail(where, "has a key with a NUL character or a lone "
                                              "surrogate"))
                continue
            name = key or "''"  # as Fields names an empty key
            keys += check_storable(item, f"{path}.{name}" if path else name, problems,
                                   depth + 1)
        return keys
    elif isinstance(value, list):
        keys = 0
        for index, item in enumerate(value):
            keys += check_storable(item, f"{where}[{index}]", problems, depth + 1)
        return keys
    return 0




# ---------------------------------------------------------------------------------------------
# Field-by-field validation


class Fields:
    """Validates the fields of one JSON object, collecting problems under dotted paths."""

    def __init__(
        self, body: Mapping[str, Any], prefix: str = "", errors: list[Detail] | None = None
    ) -> None:
        self.body = body
        self.prefix = prefix
        self.errors: list[Detail] = [] if errors is None else errors

    def path(self, name: str) -> str:
        # A key may be the empty string; a detail naming "" would read as naming nothing.
        name = name or "''"
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> None:
        self.errors.append(detail(self.path(name), message))

    def child(self, name: str, value: Mapping[str, Any]) -> Fields:
        return Fields(value, self.path(name), self.errors)

    def only(self, allowed: Iterable[str]) -> None:
        known = set(allowed)
        for key in self.body:
            if key not in known:
                self.fail(key, "is not a known field")

    def raise_if_invalid(self) -> None:
        if self.errors:
            raise invalid(self.errors)

    def _get(self, name: str, required: bool) -> tuple[bool, Any]:
        if name not in self.body:
            if required:
                self.fail(name, "is required")
            return False, None
        return True, self.body[name]

    def string(
        self,
        name: str,
        *,
        required: bool = False,
        nullable: bool = False,
        max_len: int = 255,
        min_len: int = 1,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
        allow_blank: bool = True,
    ) -> str | None:
        """``allow_blank=False``: spaces alone are refused too, for names people read."""
        present, value = self._get(name, required)
        if not present:
            return None
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.fail(name, "must be a string" + (" or null" if nullable else ""))
            return None
        if len(value) < min_len:
            self.fail(name, "must not be empty" if min_len == 1
                      else f"must be at least {min_len} characters")
            return None
        if len(value) > max_len:
            self.fail(name, f"must be at most {max_len} characters")
            return None
        if not allow_blank and not value.strip():
            self.fail(name, "must not be blank")
            return None
        if pattern is not None and not pattern.match(value):
            self.fail(name, hint or f"must match {pattern.pattern}")
            return None
        return value

    def name(self, name: str, *, required: bool = False, nullable: bool = False,
             max_len: int = 255) -> str | None:
        """A name people read and systems pass on: not blank, no control character."""
        return self.string(name, required=required, nullable=nullable, max_len=max_len,
                           allow_blank=False, pattern=NO_CONTROL_CHARS,
                           hint=CONTROL_CHARS_MESSAGE)

    def identifier(self, name: str, *, required: bool = False) -> str | None:
        value = self.string(name, required=required)
        if value is not None and (problem := identifier_problem(value)):
            self.fail(name, problem)
            return None
        return value

    def choice(
        self, name: str, choices: Iterable[str], *, required: bool = False,
        nullable: bool = False,
    ) -> str | None:
        options = tuple(choices)
        present, value = self._get(name, required)
        if not present or (value is None and nullable):
            return None
        if not isinstance(value, str) or value not in options:
            self.fail(name, f"must be one of {', '.join(options)}")
            return None
        return value

    def integer(
        self, name: str, *, required: bool = False, minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        present, value = self._get(name, required)
        if not present:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON has one number type: 60.0 is the whole number 60
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, "must be a whole number")
            return None
        if minimum is not None and value < minimum:
            self.fail(name, f"must be at least {minimum}")
            return None
        if maximum is not None and value > maximum:
            self.fail(name, f"must be at most {maximum}")
            return None
        return value

    def boolean(self, name: str, *, required: bool = False) -> bool | None:
        present, value = self._get(name, required)
        if not present:
            return None
        if not isinstance(value, bool):
            self.fail(name, "must be true or false")
            return None
        return value

    def obj(
        self, name: str, *, required: bool = False, nullable: bool = False
    ) -> dict[str, Any] | None:
        present, value = self._get(name, required)
        if not present or (value is None and nullable):
            return None
        if not isinstance(value, dict):
            self.fail(name, "must be an object" + (" or null" if nullable else ""))
            return None
        return value

    def array(
        self, name: str, *, required: bool = False, min_items: int = 0, max_items: int = 1000,
        nullable: bool = False,
    ) -> list[Any] | None:
        present, value = self._get(name, required)
        if not present or (value is None and nullable):
            return None
        if not isinstance(value, list):
            self.fail(name, "must be an array")
            return None
        if len(value) < min_items:
            self.fail(name, "must not be empty" if min_items == 1
                      else f"must hold at least {min_items} items")
            return None
        if len(value) > max_items:
            self.fail(name, f"must hold at most {max_items} items")
            return None
        return value

    def channel_list(
        self, name: str, channels: Iterable[str], *, required: bool = False,
        min_items: int = 1, nullable: bool = False,
    ) -> list[str] | None:
        allowed = tuple(channels)
        items = self.array(name, required=required, min_items=min_items,
                           max_items=len(allowed), nullable=nullable)
        if items is None:
            return None
        out: list[str] = []
        for index, item in enumerate(items):
            if not isinstance(item, str) or item not in allowed:
                self.fail(f"{name}[{index}]", f"must be one of {', '.join(allowed)}")
            elif item in out:
                self.fail(f"{name}[{index}]", f"repeats {item!r}")
            else:
                out.append(item)
        return out if len(out) == len(items) else None

    def timestamp(self, name: str, *, required: bool = False,
                  nullable: bool = False) -> datetime | None:
        present, value = self._get(name, required)
        if not present or (value is None and nullable):
            return None
        parsed = parse_rfc3339(value) if isinstance(value, str) else None
        if parsed is None:
            self.fail(name, timestamp_problem(value))
        return parsed


# ---------------------------------------------------------------------------------------------
# Single values


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name (see :meth:`Fields.name`), or None; for a name checked
    outside :class:`Fields`, such as an item of a list."""
    if not value.strip():
        return "must not be blank"
    if has_control_chars(value):
        return CONTROL_CHARS_MESSAGE
    return None


def path_id(request: web.Request, name: str) -> str:
    """A caller-chosen id from the path, for creating: a bad one is a 400 naming it."""
    value = request.match_info[name]
    problem = identifier_problem(value) or _undecodable_path(request, value)
    if problem:
        raise invalid_field(name, problem)
    return value


def _undecodable_path(request: web.Request, value: str) -> str | None:
    """The URL decoder leaves percent-escapes that are not UTF-8 (``%FF``) as they are, so
    ``/users/%FF`` would name the user ``"%FF"``, as ``/users/%25FF`` does: refused instead."""
    if "%" not in value:
        return None
    try:
        unquote_to_bytes(request.raw_path.partition("?")[0]).decode("utf-8")
    except UnicodeDecodeError:
        return "must be valid UTF-8 once percent-decoded"
    return None


def lookup_id(request: web.Request, name: str, what: str) -> str:
    """A caller-chosen id from the path, for reading: one that cannot exist is a 404."""
    value = request.match_info[name]
    if identifier_problem(value) or _undecodable_path(request, value):
        raise ApiError(404, f"{what.replace(' ', '_')}_not_found",
                       f"No {what} with that id exists in this project.")
    return value


def uuid_id(request: web.Request, name: str, what: str) -> str:
    """A generated (UUID) id from the path; anything that is not a UUID is a 404."""
    value = request.match_info[name]
    normalised = parse_uuid(value)
    if normalised is None:
        raise ApiError(404, f"{what.replace(' ', '_')}_not_found",
                       f"No {what} with that id exists in this project.")
    return normalised


def parse_uuid(value: str) -> str | None:
    if len(value) != 36:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def _from_iso(value: str) -> datetime:
    """``value`` (which matched ``_RFC3339``) as a datetime; a leap second (23:59:60 in UTC,
    whatever the offset it is written in) is the instant after 23:59:59, as POSIX time, which
    has no leap seconds, folds it. ValueError when it is no time (a 30 February, a second 60
    at any other minute), OverflowError when its leap second ends the calendar."""
    spelled = value.replace("z", "Z").replace("t", "T")
    if spelled[17:19] != "60":
        return datetime.fromisoformat(spelled)
    before = datetime.fromisoformat(spelled[:17] + "59" + spelled[19:])
    if before.tzinfo is not None:
        in_utc = before.astimezone(UTC)
        if (in_utc.hour, in_utc.minute) != (23, 59):
            raise ValueError("a leap second is 23:59:60 in UTC")
    return before + timedelta(seconds=1)


def parse_rfc3339(value: str) -> datetime | None:
    if not _RFC3339.match(value):
        return None
    try:
        parsed = _from_iso(value)
    except (ValueError, OverflowError):
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


OUT_OF_CALENDAR_MESSAGE = ("must lie from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z "
                           "once converted to UTC")


def timestamp_problem(value: Any) -> str:
    """Why ``value`` (which :func:`parse_rfc3339` refused) is no time: a well-formed time whose
    offset carries it past either end of the calendar in UTC is told apart from a misspelt one."""
    if isinstance(value, str) and _RFC3339.match(value):
        try:
            parsed = _from_iso(value)
        except OverflowError:
            return OUT_OF_CALENDAR_MESSAGE
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return OUT_OF_CALENDAR_MESSAGE
    return "must be an RFC 3339 date-time such as 2026-12-01T09:00:00Z"


def iso(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with milliseconds and ``Z``, as every response spells times."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# In the tz database's folder but no place's time: ``localtime`` is whatever this server's
# clock is set to, ``Factory`` a placeholder that means "unset".
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _NOT_ZONES


def is_timezone(value: str) -> bool:
    return value in _zones() or value == "UTC"


def is_locale(value: str) -> bool:
    return bool(_LOCALE.match(value))


def is_hhmm(value: str) -> bool:
    return bool(_HHMM.match(value))


def email_problem(value: str) -> str | None:
    # An international domain is checked in the ASCII form it is stored and sent in.
    local, at, domain = value.rpartition("@")
    value = f"{local}{at}{ascii_domain(domain)}" if at else value
    if len(value) > 254 or not _EMAIL.match(value):
        return "must be an e-mail address such as ada@example.com"
    return None


# An address is part of two unique B-tree keys (the user's contacts, delivery's outbox), and a
# B-tree entry holds at most 2,704 bytes: beside a 255-character user id, a 1,024-byte address
# always fits. No real address comes near it (FCM tokens are about 160 characters).
MAX_TARGET_BYTES = 1024


def contact_problem(channel: str, target: str, *,
                    allow_private_networks: bool = False) -> str | None:
    """Why ``target`` is not a valid address for ``channel``, or None. A webhook URL naming a
    non-public address (or localhost) is refused unless ``allow_private_networks``: a name is
    checked by the transport each time it connects, since what it resolves to can change."""
    if len(target.encode("utf-8", "surrogatepass")) > MAX_TARGET_BYTES:
        return f"must be at most {MAX_TARGET_BYTES} bytes long (UTF-8)"
    if channel == "email":
        return email_problem(target)
    if channel == "sms":
        return None if E164.match(target) else \
            "must be an E.164 phone number such as +4915112345678"
    if channel == "push":
        if not target:
            return "must be a device token"
        # No push service issues a token with white space in it (FCM's are letters, digits,
        # '-', '_' and ':'; APNs' are hex), so one with a space is a mistake, not a device.
        if not target.isprintable() or any(c.isspace() for c in target):
            return "must be a device token of printable characters without spaces"
        return None
    if channel == "webhook":
        problem = https_url_problem(target)
        if problem is None and not allow_private_networks:
            refused = refused_host(urlsplit(target).hostname or "")
            if refused is not None:
                problem = (f"must not name a private or internal address ({refused}); "
                           "webhooks reach only public addresses")
        return problem
    return "is not a channel that has contacts"


def https_url_problem(value: str) -> str | None:
    if len(value) > 2048:
        return "must be at most 2048 characters"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return "must be an https URL"
    if parts.scheme != "https" or not parts.hostname or any(c.isspace() for c in value):
        return "must be an https URL such as https://example.com/hooks"
    if port == 0:
        return "must name a valid port"
    return _host_problem(parts.hostname)


# A host name label as a lookup takes it: letters, digits, '-' and (as some DNS names carry
# them) '_', at most 63 of them.
_HOST_LABEL = re.compile(r"^[a-z0-9_-]{1,63}\Z")


def _host_problem(host: str) -> str | None:
    """Why a URL's host (lower-cased, IPv6 without brackets) can never be looked up, or None:
    the send would fail on every attempt."""
    if ":" in host:  # an IPv6 address: urlsplit checked its brackets
        return None
    try:
        # As the client spells it on the wire: international names in punycode.
        ascii_host = URL.build(scheme="https", host=host).raw_host or ""
    except (ValueError, UnicodeError):
        ascii_host = ""
    name = ascii_host[:-1] if ascii_host.endswith(".") else ascii_host
    if not name or len(name) > 253 or not all(
            _HOST_LABEL.match(label) for label in name.split(".")):
        return "must name a valid host, such as hooks.example.com"
    return None


# ---------------------------------------------------------------------------------------------
# Lists: limit and opaque cursors


def query_value(request: web.Request, name: str) -> str | None:
    """A query parameter's value, None when it is left out or given empty.

    API.md writes the message log as ``GET /v1/messages?userId=&campaignId=&status=&channel=``
    and clients fill such a template in, leaving the filters they do not use empty, as HTML
    forms do too: ``?status=`` asks for no status filter, not for a status named ''.
    """
    return request.query.get(name) or None


def limit_param(request: web.Request, default: int = 50, maximum: int = 500) -> int:
    raw = query_value(request, "limit")
    if raw is None:
        return default
    # ASCII digits only: str.isdigit() also takes "²" and "５", which int() refuses or reads.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= maximum:
        raise invalid_field("limit", f"must be a whole number from 1 to {maximum}")
    return int(raw)


# Query parameters that move along one list rather than choose it, and an inbox token, which
# says who asks (a page's token may be renewed during a walk), not what is listed.
_PAGING_PARAMS = frozenset({"cursor", "limit", INBOX_TOKEN})


def list_scope(path: str, query: Mapping[str, str]) -> str:
    """Which list a cursor walks: its path and filters (every query parameter but the paging
    ones), as a short digest. A cursor of one user's inbox, or of one filter, taken to another
    answered 200 with rows silently skipped; it is a 400 now."""
    chosen = sorted((name, value) for name, value in query.items()
                    if name not in _PAGING_PARAMS)
    digest = hashlib.blake2s(codec.dumps([path, chosen]), digest_size=6).digest()
    return base64.urlsafe_b64encode(digest).decode()


def encode_cursor(request: web.Request, *parts: Any) -> str:
    """An opaque cursor of the request's list; times go in as ``isoformat()`` to keep
    PostgreSQL's microseconds."""
    return scoped_cursor(list_scope(request.path, request.query), *parts)


def scoped_cursor(scope: str, *parts: Any) -> str:
    return base64.urlsafe_b64encode(codec.dumps([*parts, scope])).decode().rstrip("=")


def decode_cursor(request: web.Request, arity: int,
                  scope: str | None = None) -> list[Any] | None:
    """The cursor's parts, None without a cursor; a cursor we did not make is a 400, and so
    is one of another list (``scope``, by default the request's own, see :func:`list_scope`)."""
    raw = query_value(request, "cursor")
    if raw is None:
        return None
    try:
        if len(raw) > 512:
            raise ValueError("too long")
        parts = codec.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, TypeError, binascii.Error):
        parts = None
    if not isinstance(parts, list) or len(parts) != arity + 1:
        raise invalid_field("cursor", "is not a cursor this API returned")
    if parts[-1] != (scope or list_scope(request.path, request.query)):
        raise invalid_field("cursor", "is another list's cursor (another path or other "
                                      "filters); go on with the filters it was given with, or "
                                      "start again without it")
    return parts[:-1]


def cursor_time(value: Any) -> datetime:
    parsed = parse_rfc3339(value) if isinstance(value, str) else None
    if parsed is None:
        raise invalid_field("cursor", "is not a cursor this API returned")
    return parsed


class QueryChecks:
    """Runs a route's query-parameter checks and answers one 400 naming every bad parameter.

    Each check is one of the helpers below (which raise a ``validation_error`` on their own);
    ``check(fn, ...)`` returns its value, or None after noting its details, and ``done()``
    raises them all at once, so ``?limit=0&status=gone`` names both parameters.
    """

    def __init__(self) -> None:
        self.errors: list[Detail] = []

    def __call__(self, check: Callable[..., Any], *args: Any) -> Any:
        try:
            return check(*args)
        except ApiError as exc:
            if exc.status != 400 or exc.code != "validation_error":
                raise
            self.errors.extend(exc.details)
            return None

    def done(self) -> None:
        if self.errors:
            raise invalid(list({(d["field"], d["message"]): d for d in self.errors}.values()))


def page_query(request: web.Request, arity: int,
               valid: Callable[[list[Any]], bool] = lambda parts: True,
               ) -> tuple[int, list[Any] | None]:
    """A list route's ``limit`` and decoded ``cursor`` (``arity`` parts that ``valid``
    accepts), or one 400 naming both when both are bad."""
    checks = QueryChecks()
    limit = checks(limit_param, request)
    cursor = checks(_cursor_of, request, arity, valid)
    checks.done()
    return limit, cursor


def id_page_query(request: web.Request) -> tuple[int, str | None]:
    """A list by caller-chosen id: its ``limit`` and the id its page starts after."""
    # The last id of a page is an id: anything else (a NUL, which PostgreSQL's text refuses,
    # among them) was never returned.
    limit, cursor = page_query(request, 1, lambda parts: isinstance(parts[0], str)
                               and identifier_problem(parts[0]) is None)
    return limit, cursor[0] if cursor is not None else None


def id_page(request: web.Request, rows: Sequence[Any], limit: int,
            to_json: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The answer of a list by id fetched with one row past the page, which says whether
    another page follows."""
    page = rows[:limit]
    return {"items": [to_json(r) for r in page],
            "nextCursor": encode_cursor(request, page[-1]["id"]) if len(rows) > limit
            else None}


def time_uuid_cursor(request: web.Request) -> tuple[datetime, str] | None:
    """The (created_at, id) a cursor of a newest- or oldest-first list by UUID names, None
    without one."""
    cursor = decode_cursor(request, 2)
    if cursor is None:
        return None
    last_id = parse_uuid(cursor[1]) if isinstance(cursor[1], str) else None
    if last_id is None:
        raise invalid_field("cursor", "is not a cursor this API returned")
    return cursor_time(cursor[0]), last_id


def _cursor_of(request: web.Request, arity: int,
               valid: Callable[[list[Any]], bool]) -> list[Any] | None:
    parts = decode_cursor(request, arity)
    if parts is not None and not valid(parts):
        raise invalid_field("cursor", "is not a cursor this API returned")
    return parts


def query_string(request: web.Request, name: str, *, max_len: int = 255) -> str | None:
    value = query_value(request, name)
    if value is None:
        return None
    if not 1 <= len(value) <= max_len:
        raise invalid_field(name, f"must be 1 to {max_len} characters")
    if "\x00" in value:
        raise invalid_field(name, "must not contain NUL characters")
    return value


def time_query(request: web.Request, name: str) -> datetime | None:
    """A time bound (``since``, ``until``) as an RFC 3339 query parameter, None without one."""
    raw = query_string(request, name, max_len=64)
    if raw is None:
        return None
    when = parse_rfc3339(raw)
    if when is None:
        head, space, offset = raw.rpartition(" ")
        if space and parse_rfc3339(f"{head}+{offset}") is not None:
            # A query reads + as a space, so an offset written as it is arrives as " 05:30".
            raise invalid_field(name, "must be an RFC 3339 date-time: its offset's + arrived "
                                      "as a space, as + means in a query; write it as %2B")
        raise invalid_field(name, timestamp_problem(raw))
    return when


def time_range_order(since: datetime | None, until: datetime | None) -> None:
    """Swapped bounds are a 400: an empty answer would read as "nothing in that time"."""
    if since is not None and until is not None and until < since:
        raise invalid_field("until", "must not be earlier than since")


def enum_query(request: web.Request, name: str, allowed: tuple[str, ...]) -> str | None:
    value = query_value(request, name)
    if value is not None and value not in allowed:
        raise invalid_field(name, f"must be one of {', '.join(allowed)}")
    return value


def query_bool(request: web.Request, name: str) -> bool | None:
    value = query_value(request, name)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise invalid_field(name, "must be true or false")

"""Small parsing helpers shared by the provider modules."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from simulators.jsondepth import MAX_JSON_DEPTH, too_deep
from simulators.kinds import ErrorCase
from simulators.pipeline import Rejection
from simulators.records import MAX_TASK_ID_CHARS, has_lone_surrogate

# Stored email bodies are cut here so a few huge messages cannot exhaust the ring buffer.
MAX_STORED_TEXT = 256 * 1024
_EMAIL = re.compile(r"^[^@\s<>(),;:\"\[\]]+@[^@\s<>(),;:\"\[\]]+\.[^@\s<>(),;:\"\[\]]+\Z")
_NAMED = re.compile(r'^(?:\s*"(?:[^"\\]|\\.)*"\s*|[^<>",;]*)<([^<>]*)>\s*\Z')
_E164 = re.compile(r"^\+[1-9]\d{1,14}\Z")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads with any keyword builds a new decoder (and its scanner) per call.
_STRICT_DECODER = json.JSONDecoder(parse_constant=_no_constant)


class TooDeep(ValueError):
    """Valid JSON, nested deeper than any request of the real API (see jsondepth)."""


def strict_json(body: bytes) -> Any:
    """``body`` parsed as JSON as the providers' servers read it: NaN and Infinity, which
    Python's parser accepts and no JSON client writes, are errors (ValueError), and so is a
    lone surrogate escape (``"\\ud800"``): no UTF-8 text holds one. Nesting deeper than
    MAX_JSON_DEPTH is refused (TooDeep) before anything walks the value."""
    value = _STRICT_DECODER.decode(body.decode("utf-8"))
    if too_deep(body, value):
        raise TooDeep(f"The request body is nested more than {MAX_JSON_DEPTH} levels deep.")
    if b"\\u" in body and has_lone_surrogate(value):
        raise ValueError("a string holds a lone surrogate escape")
    return value


def load_json(body: bytes, *, status: int | None = None) -> Any:
    """The parsed body, or a Rejection the provider renders as its own 'bad JSON' error."""
    try:
        return strict_json(body)
    except TooDeep as exc:
        raise Rejection(ErrorCase.BAD_REQUEST, str(exc), status=status) from None
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise Rejection(
            ErrorCase.BAD_REQUEST, "The request body is not valid JSON.", status=status
        ) from None


def email_address(value: object) -> str | None:
    """The bare address of `a@b.c` or `Name <a@b.c>`, or None if it is not one."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    if _EMAIL.match(value):  # already bare
        return value
    return _parsed_address(value)


def bare_address(value: object) -> str | None:
    """`value` if it is an address alone (`a@b.c`), as fields holding only an address require:
    SendGrid's `email`, where the name has a field of its own."""
    if isinstance(value, str) and len(value) <= 512 and _EMAIL.match(value):
        return value
    return None


@functools.lru_cache(maxsize=4096)
def _parsed_address(value: str) -> str | None:
    # One mailbox, `Name <a@b.c>` or `"Name, quoted" <a@b.c>`, and nothing after it: a list
    # (`a@b.c, d@e.f`) or trailing text is refused as the providers refuse it, never cut
    # down to its first address.
    named = _NAMED.match(value)
    if named is None:
        return None
    address = named.group(1)
    return address if _EMAIL.match(address) else None


def is_phone_number(value: str) -> bool:
    """E.164, optionally behind a channel prefix such as `whatsapp:`."""
    _, _, number = value.rpartition(":")
    return bool(_E164.match(number))


def stored_text(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_STORED_TEXT else value[:MAX_STORED_TEXT] + "…[truncated]"


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def task_id_text(value: object) -> str | None:
    if isinstance(value, str | int) and not isinstance(value, bool):
        text = str(value).strip()
        return text[:MAX_TASK_ID_CHARS] or None
    return None

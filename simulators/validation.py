"""Validation of control-API input.

Every control payload is checked field by field so a bad request gets a 400 whose message
names the field and what is wrong with it, never a 500. The same checks run for the Python
control methods, which raise the same `ControlError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit


class ControlError(ValueError):
    """A control request the simulator refuses; `status` is the HTTP status it answers."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def show(value: object, limit: int = 60) -> str:
    """A short repr for error messages; fuzzed input can be megabytes long."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit limit for writing it as text
        text = "a number too long to show"
    except RecursionError:  # nested deeper than repr can follow
        text = "a value nested too deeply to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_object(payload: object, what: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise ControlError(f"{what} must be a JSON object")
    for key in payload:
        if not isinstance(key, str):
            raise ControlError(f"{what} keys must be strings")
    return payload


def reject_unknown(payload: Mapping[str, Any], allowed: Iterable[str], what: str) -> None:
    """Refuse unknown fields: a typo such as `probabilty` must not silently mean 'always'."""
    unknown = sorted(set(payload) - set(allowed))
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        raise ControlError(f"{what} has unknown field(s) {names}; allowed: {', '.join(allowed)}")


def get_str(
    payload: Mapping[str, Any], name: str, *, required: bool = False, max_len: int = 2048
) -> str | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise ControlError(f"'{name}' is required")
        return None
    if not isinstance(value, str) or not value:
        raise ControlError(f"'{name}' must be a non-empty string")
    if len(value) > max_len:
        raise ControlError(f"'{name}' must be at most {max_len} characters")
    return value


def get_number(
    payload: Mapping[str, Any],
    name: str,
    *,
    minimum: float,
    maximum: float,
    required: bool = False,
) -> float | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise ControlError(f"'{name}' is required")
        return None
    # bool is an int subclass; `true` is not a probability.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ControlError(f"'{name}' must be a number")
    # Only a float can be NaN or infinite. An int is never passed to isfinite (or float)
    # before the range check: JSON integers have no size limit, and one past a float's
    # range would raise OverflowError there. Comparing it with the float bounds is exact.
    if isinstance(value, float) and not math.isfinite(value):
        raise ControlError(f"'{name}' must be a number")
    if not minimum <= value <= maximum:
        raise ControlError(f"'{name}' must be in [{minimum:g}, {maximum:g}], got {show(value)}")
    # + 0.0 turns -0.0 into 0.0, which is what a rule echoes back.
    return float(value) + 0.0


def get_int(
    payload: Mapping[str, Any],
    name: str,
    *,
    minimum: int,
    maximum: int,
    required: bool = False,
) -> int | None:
    value = payload.get(name)
    if value is None:
        if required:
            raise ControlError(f"'{name}' is required")
        return None
    value = whole_number(value)
    if value is None:
        raise ControlError(f"'{name}' must be an integer")
    if not minimum <= value <= maximum:
        raise ControlError(f"'{name}' must be between {minimum} and {maximum}, got {show(value)}")
    return value


def whole_number(value: object) -> int | None:
    """``value`` as an int if it is a whole JSON number, else None.

    JSON has one number type: `2.0` is the number 2, and Python's json (or a computed
    `seconds * 1000`) writes it that way, so it is taken; `2.5`, `true` and `"2"` are not.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():  # False for inf and NaN
        return int(value)
    return None


def get_choice(
    payload: Mapping[str, Any], name: str, choices: Iterable[str], *, required: bool = False
) -> str | None:
    value = payload.get(name)
    options = list(choices)
    if value is None:
        if required:
            raise ControlError(f"'{name}' is required, one of: {', '.join(options)}")
        return None
    if not isinstance(value, str) or value not in options:
        raise ControlError(f"'{name}' must be one of: {', '.join(options)}; got {show(value)}")
    return value


def require_choice(payload: Mapping[str, Any], name: str, choices: Iterable[str]) -> str:
    value = get_choice(payload, name, choices, required=True)
    assert value is not None  # required=True raised otherwise
    return value


def http_url_problem(url: str) -> str | None:
    """Why nothing could ever be posted to ``url``, or None if it is an absolute http(s) URL
    with a host and a usable port. A webhook URL is checked when it is configured: refused
    later, at each post, it would only show up as receipts that all failed.

    No URL holds raw whitespace or control characters: urlsplit drops tabs and line breaks
    and the HTTP client quotes the rest, so receipts would go somewhere other than the URL
    given (and a line break would split the log line naming it)."""
    if any(char.isspace() or not char.isprintable() for char in url):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port  # parsed lazily: a port out of range or not a number raises here
    except ValueError as exc:  # also an unbalanced or invalid IPv6 bracket
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    host = parts.hostname
    if not host:
        return "it names no host"
    if port == 0:
        return "port 0 cannot be connected to"
    return None

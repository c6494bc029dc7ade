"""What the names a caller gives things (events, topics, segments, campaigns, projects, keys)
may hold: no C0 or C1 control character, since a name is written to logs, sent to providers and
shown in UIs, where an escape sequence or a line break in it would be read as something else.
And what the ids a caller chooses (users, templates, workflows) may be, wherever they are given:
in a path, in a body, in a workflow step.
"""

from __future__ import annotations

import re

# C0, DEL and C1, as the body of a regex character class: the same in Python's dialect and in
# the ECMA-262 one of JSON Schema, so the OpenAPI document states this very rule.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
CONTROL_CHARS_MESSAGE = "must not contain control characters"
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")


def is_utf8(value: str) -> bool:
    """Whether ``value`` can be written as UTF-8: no lone surrogate (what Python keeps of bytes
    that were no UTF-8 in an environment variable, or a JSON escape such as ``\ud800``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def has_control_chars(value: str) -> bool:
    return _CONTROL.search(value) is not None


def escape_control_chars(value: str) -> str:
    """``value`` with each control character written as a ``\\uXXXX`` escape, for text that
    quotes what a caller sent (an error naming a key) and goes to logs and UIs."""
    return _CONTROL.sub(lambda found: f"\\u{ord(found.group()):04x}", value)


def identifier_problem(value: str) -> str | None:
    """Why ``value`` cannot be a caller-chosen id (user, template, workflow), or None."""
    if not 1 <= len(value) <= 255:
        return "must be 1 to 255 characters"
    if not value.isprintable():
        return "must not contain control or separator characters"
    if value != value.strip():
        return "must not start or end with whitespace"
    if value in (".", ".."):
        # Clients and proxies resolve /v1/users/.. to /v1/: such a user could never be read.
        return "must not be '.' or '..'"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid UTF-8"
    return None

"""What the names a caller gives things (events, topics, segments, campaigns, projects, keys)
may hold: no C0 or C1 control character, since a name is written to logs, sent to providers and
shown in UIs, where an escape sequence or a line break in it would be read as something else.
"""

from __future__ import annotations

import re

# C0, DEL and C1, as the body of a regex character class: the same in Python's dialect and in
# the ECMA-262 one of JSON Schema, so the OpenAPI document states this very rule.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
CONTROL_CHARS_MESSAGE = "must not contain control characters"
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")


def has_control_chars(value: str) -> bool:
    return _CONTROL.search(value) is not None

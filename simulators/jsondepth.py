"""A bound on how deeply a JSON body may nest, checked once where each body is parsed.

Python's JSON parser follows nesting up to about 1,000 levels, close to the interpreter's
recursion limit, so a body just inside it parses and then overflows the stack in the next
step that walks it (hashing a prompt, storing a message, looking for lone surrogates). No
provider request or control call needs more than a handful of levels; refusing anything
deeper than MAX_JSON_DEPTH at parse time means no later step can recurse too deep.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64


def too_deep(raw: bytes, value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed from ``raw``) nests arrays and objects more than ``limit``
    levels deep; a top-level array or object is level 1."""
    # A body with no more opening brackets than the limit cannot nest deeper than it: almost
    # every request is settled by two C-speed counts, without walking what was parsed.
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    # Walked with an explicit stack: recursing here would fail on the very input it is for.
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False

"""The server's string rules (validation.py) as JSON Schema patterns, for the OpenAPI document.

A pattern is ECMA-262 and matched as Unicode; schemathesis generates from it with Python's
``re`` and checks with Rust's ``regex``. So each pattern keeps to what the three read alike:
``\\uXXXX`` escapes for the Basic Multilingual Plane, other code points as themselves, no
counted repetition of a large class (Rust compiles each repetition out and gives up), and
``$`` for the end (ECMA-262's matches only there). Where the server's rule needs more than a
regex (a byte length, what a host name resolves to), the pattern is the stricter side of it,
so a value the document admits is one the server takes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import cache

from notifkit.text import CONTROL_CHARS

_SURROGATES = range(0xD800, 0xE000)


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def class_body(test: Callable[[str], bool]) -> str:
    """The code points ``test`` holds for, as the body of a character class."""
    # One pass in C over every code point, then the runs of members (about 0.1 s).
    results = bytes(map(test, map(chr, range(sys.maxunicode + 1))))
    spans = [(found.start(), found.end() - 1) for found in re.finditer(b"\x01+", results)]
    # Rust's regex refuses a surrogate as a range's end (JSON text cannot hold a lone one
    # anyway); a span merely crossing them is read as the scalar values it holds.
    assert not any(end in _SURROGATES or first in _SURROGATES for first, end in spans)
    return "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in spans)


@cache
def _white_space() -> str:
    return class_body(str.isspace)


@cache
def _printable() -> str:
    return class_body(str.isprintable)


def printable(*, space: bool = True) -> str:
    """What ``str.isprintable`` takes (no control, formatting, separator other than the space,
    private-use or unassigned code point, in this Python's Unicode version). Listed rather than
    negated: schemathesis's generator walks a class's ranges code point by code point, and the
    printable ones are the fewer by far."""
    body = _printable()
    assert body.startswith(r"\u0020-\u007e")
    return body if space else r"\u0021-\u007e" + body[len(r"\u0020-\u007e"):]


@cache
def id_pattern() -> str:
    """text.identifier_problem: printable, no space at either end, not '.' or '..'.
    The ends are lookaheads so the long class appears once (each appearance costs the
    generator about a second)."""
    return rf"^(?!\.\.?$)(?! )(?![\s\S]* $)[{printable()}]+$"


@cache
def name_pattern() -> str:
    """Fields.name: no control character and something besides white space (``str.strip``'s
    white space; ECMA-262's ``\\s`` differs, taking U+FEFF)."""
    space = _white_space()
    return f"^[^{CONTROL_CHARS}]*[^{CONTROL_CHARS}{space}][^{CONTROL_CHARS}]*$"


E164_PATTERN = r"^\+[1-9][0-9]{6,14}$"
# validation._EMAIL, whose \Z becomes $.
EMAIL_PATTERN = (
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@"
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
)


@cache
def push_token_pattern() -> str:
    """Printable and without white space (the space is the only printable white space)."""
    return f"^[{printable(space=False)}]+$"


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# A last label that starts with a letter: no spelling of an address (127.1, 0x7f.1) ends so.
_TOP_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_LOCALHOST = "".join(f"[{c.upper()}{c}]" for c in "localhost")
_PORT = (r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
         r"|[1-9][0-9]{0,3}))?")


@cache
def https_url_pattern() -> str:
    """An https URL to a host named in DNS (an address, even a public one, and localhost are
    left out: which addresses the server takes depends on its settings), a port 1-65535, and
    no white space (nor NUL, which no stored string holds)."""
    space = r"\x00" + _white_space()
    host = rf"(?!(?:{_LABEL}\.)*{_LOCALHOST}\.?(?:[:/?#]|$))(?:{_LABEL}\.)*{_TOP_LABEL}\.?"
    return rf"^https://{host}{_PORT}(?:[/?#][^{space}]*)?$"

"""What the SMTP simulator records of a message: its headers and text, read one by one.

Mail clients send all sorts: encoded words that do not decode, charsets nobody knows,
transfer encodings with broken padding. Each header and each body part is decoded on its
own and, when it will not decode, kept as its raw text with replacement characters for
bytes that are not UTF-8, so one bad part never erases the rest of the record.
"""

from __future__ import annotations

import codecs
import email
import email.policy
import logging
import re
from email.message import EmailMessage
from typing import Any

from simulators.providers.common import drop_none, stored_text

log = logging.getLogger("simulators")

HEADERS = {"from": "From", "to": "To", "subject": "Subject", "message_id": "Message-ID"}
# RFC 5322 unfolding: a line break followed by whitespace continues the header.
_FOLD = re.compile(r"\r?\n(?=[ \t])")


def parse_message(content: bytes) -> EmailMessage | None:
    try:
        message = email.message_from_bytes(content, policy=email.policy.default)
    except Exception:  # arbitrary client bytes; the email package raises many kinds
        return None
    return message if isinstance(message, EmailMessage) else None


def message_content(message: EmailMessage) -> dict[str, Any]:
    """The headers and text of ``message`` worth recording; what does not decode is kept raw."""
    values = {key: header_text(message, name) for key, name in HEADERS.items()}
    values["text"] = _body_text(message, "plain")
    values["html"] = _body_text(message, "html")
    return drop_none(values)


def header_text(message: EmailMessage, name: str) -> str | None:
    """The decoded header, or its raw text when it does not decode."""
    raw = _raw_header(message, name)
    if raw is None:
        return None
    try:
        decoded = str(message.get(name, ""))
    except Exception:  # the header parser raises on some malformed input
        decoded = ""
    # An encoded word that does not decode (`=?utf-8?B?!!!?=`) comes out empty, while its
    # raw text at least shows what was sent.
    if decoded.strip() or not raw.strip():
        return decoded
    return _readable(_FOLD.sub("", raw).strip())


def _raw_header(message: EmailMessage, name: str) -> str | None:
    wanted = name.lower()
    for key, value in message.raw_items():
        if key.lower() == wanted:
            return str(value)
    return None


def _body_text(message: EmailMessage, subtype: str) -> str | None:
    try:
        part = message.get_body(preferencelist=(subtype,))
    except Exception:  # a broken MIME structure: no such part to read
        log.debug("smtp could not find the %s part of a message.", subtype)
        return None
    if not isinstance(part, EmailMessage):
        return None
    return stored_text(part_text(part))


def part_text(part: EmailMessage) -> str:
    """A text part's content, decoded as its charset says or, failing that, as UTF-8 with
    replacement characters."""
    undeclared = _undeclared_utf8(part)
    if undeclared is not None:
        return undeclared
    try:
        content = part.get_content()
        if isinstance(content, str):
            return content
    except Exception:  # an unknown charset (LookupError), a broken transfer encoding...
        log.debug("smtp could not decode a message part; keeping its raw text.")
    try:
        payload = part.get_payload(decode=True)
    except Exception:  # nothing left to read it by
        return ""
    if isinstance(payload, bytes):
        return payload.decode(_known_charset(part), "replace")
    return "" if payload is None else str(payload)


def _undeclared_utf8(part: EmailMessage) -> str | None:
    """The text of a part that claims ASCII (by naming no charset, or us-ascii) but carries
    8-bit UTF-8, as SMTPUTF8 clients and hand-written mail send it. Read as ASCII, every
    accented letter would be stored as replacement characters, losing what was sent."""
    if part.get_content_charset() not in (None, "us-ascii", "ascii"):
        return None
    try:
        payload = part.get_payload(decode=True)
    except Exception:  # a broken transfer encoding: part_text's fallbacks deal with it
        return None
    if not isinstance(payload, bytes) or payload.isascii():
        return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _known_charset(part: EmailMessage) -> str:
    charset = part.get_content_charset() or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        return "utf-8"
    return charset


def _readable(raw: str) -> str:
    """Raw header text with the bytes that were not ASCII (kept by the parser as surrogate
    escapes) read as UTF-8, replacement characters where they are not."""
    return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

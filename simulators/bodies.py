"""Request bodies, decoded from their Content-Encoding by the simulator rather than by aiohttp.

aiohttp decodes a body inside its HTTP parser, before any handler runs: a coding it has no
library for (br, zstd) is answered there with a plain-text 400 that no provider's client can
read, and a coding it does not know passes as if it were identity. So the app runs with
aiohttp's decoding off and each route that reads a body reads it here, to answer in its own
format: 415 for a coding other than gzip (x-gzip), deflate or identity, 400 for a body that
does not decode as its coding says, and the route's too-large answer for a body that inflates
past the body limit (a small gzip body must not grow without bound).
"""

from __future__ import annotations

import logging
import zlib

from aiohttp import web

log = logging.getLogger("simulators")

_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": zlib.MAX_WBITS}
CODINGS = frozenset({*_ZLIB_WBITS, "identity"})


class UnsupportedEncoding(Exception):
    def __init__(self, coding: str) -> None:
        super().__init__(coding)
        self.coding = coding


class UndecodableBody(Exception):
    """The body is not in the coding its Content-Encoding names."""


class InflatedTooLarge(Exception):
    """Decoded, the body would pass the body limit."""


def unsupported_message(coding: str) -> str:
    return (f"The request body's Content-Encoding {coding!r} is not supported; send it "
            "uncompressed, gzip or deflate.")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body with its Content-Encoding undone. Raises UnsupportedEncoding, UndecodableBody
    (logged as a warning: a client sending such bodies has a bug worth seeing) or
    InflatedTooLarge, and what ``request.read()`` raises."""
    raw = await request.read()
    header = request.headers.get("Content-Encoding", "")
    try:
        return decode(raw, header, limit)
    except UndecodableBody:
        log.warning("A %s %s body does not decode as its Content-Encoding (%s) says; refused.",
                    request.method, request.path, header)
        raise


def decode(raw: bytes, header: str, limit: int) -> bytes:
    codings = [coding.strip().lower() for coding in header.split(",") if coding.strip()]
    # Every coding is checked before any is undone: an unsupported one is a 415 whatever
    # state the rest of the body is in.
    for coding in codings:
        if coding not in CODINGS:
            raise UnsupportedEncoding(coding)
    # Codings are listed in the order they were applied: undo them from the last.
    for coding in reversed(codings):
        if coding != "identity":
            raw = _inflate(raw, coding, limit)
    return raw


def _inflate(raw: bytes, coding: str, limit: int) -> bytes:
    if not raw:
        return raw
    wbits = _ZLIB_WBITS[coding]
    if coding == "deflate" and not _zlib_header(raw):
        # Many clients send deflate without the zlib wrapper RFC 9110 asks for.
        wbits = -zlib.MAX_WBITS
    out = b""
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            # At most one byte past the limit: enough to tell it was passed.
            out += inflater.decompress(raw, limit + 1 - len(out))
        except zlib.error:
            raise UndecodableBody() from None
        if len(out) > limit:
            raise InflatedTooLarge()
        if not inflater.eof:
            raise UndecodableBody()  # cut short
        raw = inflater.unused_data
        if not raw:
            return out
        if wbits != _GZIP_WBITS:
            raise UndecodableBody()  # bytes after the end of a deflate stream
        # RFC 1952: a gzip body may be several members back to back; it decodes to their
        # contents in order.


def _zlib_header(raw: bytes) -> bool:
    """Whether ``raw`` starts with a zlib header (RFC 1950): deflate method, check bits."""
    return len(raw) >= 2 and raw[0] & 0x0F == 8 and (raw[0] << 8 | raw[1]) % 31 == 0

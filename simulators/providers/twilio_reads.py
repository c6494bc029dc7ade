"""Twilio Messages reads: fetch one message, list an account's messages a page at a time.

GET /2010-04-01/Accounts/{AccountSid}/Messages/{MessageSid}.json -> the Message resource
GET /2010-04-01/Accounts/{AccountSid}/Messages.json               -> a page of them

Both answer from what the simulator recorded, for the account in the path only (as Twilio
scopes messages to their account), with the message's `status` following the receipts the
simulator drew for it (`message_resource`). The list is newest first, filtered by `To`, `From`
and `DateSent` / `DateSent<` / `DateSent>` (a `YYYY-MM-DD` day or an ISO 8601 instant, GMT;
`DateSent` takes an instant's whole day, as Twilio's date filter does),
and paged by `PageSize` (default 50, at most 1000: above is 400 code 20007), `Page` and the
`PageToken` that `next_page_uri` / `previous_page_uri` carry ("PA"/"PB" + the sid the page
continues after / before), so paging stays put while new messages arrive. Reads are not
metered, faulted or counted in the stats, which describe sends.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from simulators.kinds import ErrorCase, Provider
from simulators.providers.twilio import API_VERSION, Twilio, message_resource, sent_at
from simulators.records import MessageRecord
from simulators.replies import Reply, json_reply
from simulators.state import STATE

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
_FILTERS = ("To", "From", "DateSent", "DateSent<", "DateSent>")


class _BadQuery(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def fetch_message(request: web.Request) -> web.Response:
    provider = Twilio()
    refused = unauthenticated(provider, request)
    if refused is not None:
        return refused.response()
    record = request.app[STATE].messages.find(Provider.TWILIO, request.match_info["message_sid"])
    if record is None or record.meta.get("account_sid") != request.match_info["sid"]:
        return not_found(provider, request.path).response()
    return json_reply(200, message_resource(record)).response()


async def list_messages(request: web.Request) -> web.Response:
    provider = Twilio()
    refused = unauthenticated(provider, request)
    if refused is not None:
        return refused.response()
    account_sid = request.match_info["sid"]
    try:
        page = _page(request, account_sid)
    except _BadQuery as bad:
        return provider.render(
            ErrorCase.BAD_REQUEST, detail=bad.message, code=str(bad.code)
        ).response()
    return json_reply(200, page).response()


def not_found(provider: Twilio, path: str) -> Reply:
    return provider.render(
        ErrorCase.NOT_FOUND, detail=f"The requested resource {path} was not found"
    )


def unauthenticated(provider: Twilio, request: web.Request) -> Reply | None:
    return None if provider.credentials(request) else provider.render(ErrorCase.MISSING_CREDENTIALS)


def _page(request: web.Request, account_sid: str) -> dict[str, Any]:
    query = request.query
    size = _int(query.get("PageSize"), "PageSize", DEFAULT_PAGE_SIZE, minimum=1)
    if size > MAX_PAGE_SIZE:
        raise _BadQuery(
            20007, f"Page size too large: the maximum page size is {MAX_PAGE_SIZE}."
        )
    number = _int(query.get("Page"), "Page", 0, minimum=0)
    filters = [(name, query[name]) for name in _FILTERS if query.get(name)]
    wanted = _matcher(dict(filters))
    items = [
        record
        for record in request.app[STATE].messages.query(
            provider=Provider.TWILIO, limit=len(request.app[STATE].messages)
        )
        if record.meta.get("account_sid") == account_sid and wanted(record)
    ]
    token = query.get("PageToken", "")
    first = _first_index(items, token, number * size, size)
    shown = items[first : first + size]

    path = f"/{API_VERSION}/Accounts/{account_sid}/Messages.json"

    def uri(page_number: int, page_token: str | None) -> str:
        params = [*filters, ("PageSize", str(size)), ("Page", str(page_number))]
        if page_token:
            params.append(("PageToken", page_token))
        return f"{path}?{urlencode(params)}"

    start = number * size
    more = first + len(shown) < len(items)
    return {
        "messages": [message_resource(record) for record in shown],
        "end": start + max(len(shown) - 1, 0),
        "first_page_uri": uri(0, None),
        "next_page_uri": uri(number + 1, "PA" + shown[-1].id) if more and shown else None,
        "page": number,
        "page_size": size,
        "previous_page_uri": (
            uri(number - 1, "PB" + shown[0].id if shown else None) if number > 0 else None
        ),
        "start": start,
        "uri": uri(number, token or None),
    }


def _first_index(items: list[MessageRecord], token: str, offset: int, size: int) -> int:
    """Where the page starts: after (PA) or a page before (PB) the token's message when it is
    still listed, else at `Page` x `PageSize`."""
    if token[:2] in ("PA", "PB"):
        for index, record in enumerate(items):
            if record.id == token[2:]:
                return index + 1 if token.startswith("PA") else max(index - size, 0)
    return offset


def _int(value: str | None, name: str, default: int, *, minimum: int) -> int:
    if value is None or value == "":
        return default
    try:
        # int() also reads other scripts' digits ("\uff15") and digit separators ("1_0"),
        # as the Resend list's limit does not either.
        if not value.isascii() or "_" in value:
            raise ValueError(value)
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise _BadQuery(20001, f"Invalid {name}: {value[:40]!r} is not an integer >= {minimum}.")
    return number


def _matcher(filters: dict[str, str]) -> Callable[[MessageRecord], bool]:
    to = filters.get("To")
    sender = filters.get("From")
    on = _span(filters, "DateSent", whole_day=True)
    before = _span(filters, "DateSent<")
    after = _span(filters, "DateSent>")

    def wanted(record: MessageRecord) -> bool:
        if to is not None and record.to != to:
            return False
        if sender is not None and record.content.get("from") != sender:
            return False
        if on is None and before is None and after is None:
            return True
        moment = sent_at(record)
        if moment is None:  # not sent yet: no date to be found by
            return False
        sent = moment.astimezone(UTC)
        if on is not None and not on[0] <= sent < on[1]:
            return False
        if before is not None and not sent < before[1]:
            return False
        return after is None or sent >= after[0]

    return wanted


def _span(
    filters: dict[str, str], name: str, *, whole_day: bool = False
) -> tuple[datetime, datetime] | None:
    """A filter value as the [start, end) it names: a day, or the second of an instant.

    ``whole_day``: the GMT day of an instant too. Twilio's `DateSent` is a date, and its SDK
    writes a date as that day's midnight (`2026-12-04T00:00:00Z`), which as one second found
    none of the day's messages."""
    value = filters.get(name)
    if value is None:
        return None
    text = value.strip()
    try:
        if len(text) == 10:
            start = datetime.combine(date.fromisoformat(text), time(), UTC)
            length = timedelta(days=1)
        else:
            start = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if start.tzinfo is None:
                start = start.replace(tzinfo=UTC)
            start = start.astimezone(UTC)
            length = timedelta(seconds=1)
            if whole_day:
                start = datetime.combine(start.date(), time(), UTC)
                length = timedelta(days=1)
    except (ValueError, OverflowError):
        raise _BadQuery(
            20001, f"Invalid {name}: {text[:40]!r} is not a YYYY-MM-DD date or an ISO 8601 time."
        ) from None
    try:
        end = start + length
    except OverflowError:  # the last day there is: it ends with time itself
        end = datetime.max.replace(tzinfo=UTC)
    return start, end

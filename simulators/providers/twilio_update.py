"""Twilio's Message update: cancel a scheduled message, or redact a message's body.

POST /2010-04-01/Accounts/{AccountSid}/Messages/{MessageSid}.json, a form body with
`Status=canceled` (the only status a caller may set) or `Body=` (empty: the only body a caller
may set), answers the Message resource as it now reads (200).

As Twilio has it: only a message still `scheduled` can be canceled (a canceled one is
canceled again, harmlessly); any other is refused with 30409. A canceled message is never
sent: its receipts are not posted and it reads `canceled` from then on. A body can be redacted
only once the message has been sent, so a scheduled one is refused (20009). Like the reads,
updates are not metered, faulted or counted in the stats, which describe sends.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from aiohttp import web

from simulators.kinds import Provider
from simulators.pipeline import Rejection, read_request_body
from simulators.providers.twilio import Twilio, message_resource, twilio_error
from simulators.providers.twilio_reads import not_found, unauthenticated
from simulators.receipts import due_in_s
from simulators.records import CANCELED, MessageRecord
from simulators.replies import json_reply
from simulators.state import STATE


async def update_message(request: web.Request) -> web.Response:
    provider = Twilio()
    refused = unauthenticated(provider, request)
    if refused is not None:
        return refused.response()
    state = request.app[STATE]
    record = state.messages.find(Provider.TWILIO, request.match_info["message_sid"])
    if record is None or record.meta.get("account_sid") != request.match_info["sid"]:
        return not_found(provider, request.path).response()
    try:
        body = await read_request_body(request, provider, state)
        _apply(record, body)
    except Rejection as rejection:
        return provider.render(rejection.case, status=rejection.status,
                               detail=rejection.detail, code=rejection.code).response()
    return json_reply(200, message_resource(record)).response()


def _apply(record: MessageRecord, body: bytes) -> None:
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise twilio_error(20001, "The request body is not form-encoded UTF-8 text.") from None
    fields = {name: values[0] for name, values in form.items() if values}
    if "Status" in fields:
        status = fields["Status"].strip()
        if status != CANCELED:
            raise twilio_error(20001, f"Status: {status!r} is not a status a message can be given; "
                                "the only one is 'canceled'.")
        if record.meta.get(CANCELED):
            return
        if due_in_s(record) <= 0:
            raise twilio_error(30409, "This message cannot be canceled: it is no longer scheduled.")
        record.meta[CANCELED] = True
        record.note_event(CANCELED)
        return
    if "Body" in fields:
        if fields["Body"] != "":
            raise twilio_error(20001, "Body: a message's body can only be redacted (Body set to an "
                                "empty string), not changed.")
        if record.meta.get(CANCELED) or due_in_s(record) > 0:
            raise twilio_error(20009, "A message's body can be redacted only once it was sent.")
        content = record.content
        content["body"] = ""
        record.content = content
        record.pack()
        return
    raise twilio_error(20001, "Nothing to update: give Status=canceled or an empty Body.")


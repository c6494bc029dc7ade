"""What every email transport sends: sender, recipient, subject, bodies and headers.

Every email carries ``List-Unsubscribe: <url>`` and ``List-Unsubscribe-Post:
List-Unsubscribe=One-Click`` (RFC 8058) when the task has an unsubscribe link (the engine
signs one for every email), and the task id in ``X-Notifkit-Task-Id``.

A subject is one header line: line breaks a template or its data put in it (``\\r\\n``,
``\\u2028``, ...) become spaces, so a subject can neither inject headers nor make an SMTP
message impossible to build on every attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from notifkit.config import check_credential, check_from_address
from notifkit.transports.base import TASK_ID_HEADER, HttpTransport, Message


@dataclass(frozen=True)
class Email:
    from_addr: str
    to: str
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]


def build_email(message: Message, from_addr: str) -> Email:
    content = message.content
    headers = {TASK_ID_HEADER: message.task_id}
    if message.unsubscribe_url:
        headers["List-Unsubscribe"] = f"<{message.unsubscribe_url}>"
        headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    text = _str(content.get("text"))
    html = _str(content.get("html"))
    if text is None and html is None:
        text = ""
    return Email(
        from_addr=from_addr,
        to=message.to,
        subject=one_line(_str(content.get("subject")) or ""),
        text=text,
        html=html,
        headers=headers,
    )


def one_line(text: str) -> str:
    """``text`` with each line break (any that ``str.splitlines`` knows) made one space."""
    return " ".join(text.splitlines())


def _str(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


class HttpEmailTransport(HttpTransport):
    """An e-mail provider's HTTP API reached with an API key, sending from one address."""

    channel: str = "email"

    def __init__(self, *, api_key: str, from_addr: str, base_url: str,
                 **options: Any) -> None:
        super().__init__(base_url=base_url, **options)
        self.api_key = api_key
        self.from_addr = from_addr

    def check_arguments(self) -> None:
        super().check_arguments()
        check_credential(self.argument("api_key"), self.api_key)
        check_from_address(self.argument("from_addr"), self.from_addr)

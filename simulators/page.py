"""The `/_sim/` page: what a person watching a staging run wants to see, refreshed by itself.

Everything shown comes from clients, so every value is HTML-escaped, and email HTML is shown
inside an `<iframe sandbox srcdoc=...>`: it renders as the recipient would see it, but its
scripts, forms and links cannot act on this page.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from notifkit.clock import iso
from simulators.kinds import Provider
from simulators.records import MessageRecord
from simulators.state import SimState

REFRESH_S = 3
RECENT = 50
PREVIEW_CHARS = 400

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.05rem; margin-top: 1.5rem; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left; }
td { vertical-align: top; }
th { background: #f4f4f4; } .dup { color: #b00; font-weight: bold; } .muted { color: #777; }
iframe { width: 100%; height: 12rem; border: 1px solid #ccc; background: #fff; }
pre { white-space: pre-wrap; margin: 0; max-height: 12rem; overflow: auto; }
"""


def _cell(value: object) -> str:
    if value is None or value == "":
        return '<td class="muted">–</td>'
    return f"<td>{escape(str(value))}</td>"


def _short(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def _preview(record: MessageRecord) -> str:
    content = record.content
    provider = record.provider
    if provider in (Provider.RESEND, Provider.SENDGRID, Provider.SMTP):
        subject = f"<strong>{escape(str(content.get('subject') or '(no subject)'))}</strong>"
        html = content.get("html")
        if isinstance(html, str) and html:
            return f'{subject}<iframe sandbox="" srcdoc="{escape(html, quote=True)}"></iframe>'
        return f"{subject}<pre>{escape(_short(str(content.get('text') or '')))}</pre>"
    if provider is Provider.TWILIO:
        return f"<pre>{escape(_short(str(content.get('body') or '')))}</pre>"
    if provider is Provider.FCM:
        notification = content.get("notification") or {}
        title = notification.get("title", "") if isinstance(notification, dict) else ""
        body = notification.get("body", "") if isinstance(notification, dict) else ""
        data = json.dumps(content.get("data") or {}, ensure_ascii=False)
        return (
            f"<strong>{escape(str(title))}</strong><pre>{escape(_short(str(body)))}</pre>"
            f'<div class="muted">data: {escape(_short(data))}</div>'
        )
    messages: list[Any] = content.get("messages") or []
    prompt = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else ""
    return (
        f'<div class="muted">{escape(_short(str(prompt)))}</div>'
        f"<pre>{escape(_short(str(content.get('completion') or '')))}</pre>"
    )


def _stats_table(state: SimState) -> str:
    rows = []
    for name, item in state.stats.to_items().items():
        # Only the kinds that fired: seven zeros per row would hide the one that matters.
        faults = ", ".join(f"{kind}: {n}" for kind, n in item["faults"].items() if n)
        cells = [name, item["requests"], item["accepted"], item["duplicates"], item["rateLimited"]]
        cells += [item["rejected"], item["replays"], faults]
        rows.append("<tr>" + "".join(_cell(c) for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "provider",
            "requests",
            "accepted",
            "duplicates",
            "rate limited",
            "rejected",
            "replays",
            "faults",
        )
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _faults_table(state: SimState) -> str:
    rules = state.faults.active()
    if not rules:
        return '<p class="muted">No active fault rules.</p>'
    head = "".join(
        f"<th>{h}</th>"
        for h in ("id", "provider", "kind", "to", "probability", "times left", "status", "fired")
    )
    rows = []
    for rule in rules:
        cells = [rule.id, rule.provider, rule.kind.value, rule.to, rule.probability, rule.remaining]
        cells += [rule.status, rule.fired]
        rows.append("<tr>" + "".join(_cell(c) for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _messages_table(state: SimState) -> str:
    records = state.messages.query(limit=RECENT)
    if not records:
        return '<p class="muted">No messages yet.</p>'
    head = "".join(
        f"<th>{h}</th>" for h in ("received", "provider", "to", "task", "accepts", "message")
    )
    rows = []
    for record in records:
        accepts = str(record.accept_count)
        accept_cell = (
            f'<td class="dup">{accepts}</td>' if record.accept_count > 1 else _cell(accepts)
        )
        cells = (
            _cell(iso(record.received_at))
            + _cell(record.provider.value)
            + _cell(", ".join(record.recipients))
        )
        cells += _cell(record.task_id) + accept_cell + f"<td>{_preview(record)}</td>"
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render_page(state: SimState) -> str:
    receipts = state.receipts.item()
    receipt_line = (
        f"Receipts to {escape(str(receipts['url']))}: {receipts['sent']} sent, "
        f"{receipts['failed']} failed, {receipts['pending']} pending."
        if receipts["enabled"]
        else "Receipts are off."
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">
<title>notifkit simulators</title><style>{_STYLE}</style></head>
<body>
<h1>notifkit provider simulators</h1>
<p class="muted">Seed {state.seed} · {len(state.messages)} messages kept ·
refreshes every {REFRESH_S}s. {receipt_line}</p>
<h2>Counters</h2>{_stats_table(state)}
<h2>Active faults</h2>{_faults_table(state)}
<h2>Recent messages (newest first, up to {RECENT})</h2>{_messages_table(state)}
</body></html>"""

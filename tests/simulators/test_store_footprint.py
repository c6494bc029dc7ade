"""What the simulators keep per accepted message stays cheap for Python's garbage collector.

A full store (the benchmark keeps 150,000 messages, each with an idempotency key) held about
a dozen collector-tracked objects per message, and every full collection walked them all:
the simulator paused for up to 150 ms under load, which notifkit's p99 then showed.
"""

from __future__ import annotations

import gc

import pytest

from simulators import records
from simulators.idempotency import IdempotencyCache
from simulators.kinds import Provider
from simulators.records import MessageRecord, MessageStore
from simulators.replies import json_reply

MESSAGES = 2_000


def _content(n: int) -> dict[str, object]:
    return {"from": "Acme <hi@acme.test>", "to": [f"user{n}@example.com"],
            "subject": "Grüße", "html": "<p>hi</p>", "tags": [{"name": "n", "value": str(n)}],
            "headers": {"X-Entity-Ref-ID": f"ref-{n}"}, "big": 2**70}




def test_a_stored_message_and_its_idempotency_key_cost_the_collector_few_objects() -> None:
    store = MessageStore(max_messages=MESSAGES)
    cache = IdempotencyCache()
    gc.collect()
    before = len(gc.get_objects())
    for n in range(MESSAGES):
        key = f"task-{n}"
        cache.begin(Provider.RESEND, "re_key", key, f"print-{n}")
        record = store.add(MessageRecord(
            id=f"m{n}", provider=Provider.RESEND, recipients=[f"user{n}@example.com"],
            task_id=key, idempotency_key=key, content=_content(n)))
        cache.complete(Provider.RESEND, "re_key", key, json_reply(200, {"id": record.id}))
    gc.collect()
    per_message = (len(gc.get_objects()) - before) / MESSAGES
    assert per_message <= 4, per_message


def test_a_stored_message_reads_back_its_content_unchanged() -> None:
    store = MessageStore(max_messages=10)
    content = _content(7)
    record = store.add(MessageRecord(id="m7", provider=Provider.SMTP, recipients=["a@b.c"],
                                     task_id=None, idempotency_key=None, content=content))
    assert record.content == content
    assert record.to_item()["content"] == content
    # Each read is a copy: changing it changes nothing stored.
    record.content["subject"] = "changed"
    assert record.content["subject"] == "Grüße"


@pytest.mark.parametrize("with_orjson", [True, False])
def test_a_lone_surrogate_in_stored_content_reads_back_replaced(
    monkeypatch: pytest.MonkeyPatch, with_orjson: bool,
) -> None:
    if not with_orjson:
        monkeypatch.setattr(records, "_orjson", None)
    store = MessageStore(max_messages=10)
    record = store.add(MessageRecord(
        id="m1", provider=Provider.SMTP, recipients=["a@b.c"], task_id=None,
        idempotency_key=None, content={"subject": "a\ud800b", "n": [2**70, "ok"]}))
    # As scrub() writes it (U+FFFD for each byte of the surrogate), so listing never fails.
    assert record.content == {"subject": "a\ufffd\ufffd\ufffdb", "n": [2**70, "ok"]}
    assert record.to_item()["content"]["subject"].encode("utf-8")

"""What delivery takes as an outbound task: the fields a parked task carries back."""

from __future__ import annotations

from typing import Any

import pytest

from notifkit.errors import MalformedPayload
from notifkit.messages import parse_outbound


def task(**extra: Any) -> dict[str, Any]:
    return {"taskId": "t1", "eventId": "e1", "projectId": "p1", "userId": "u1",
            "template": "t", "channel": "sms", "priority": "normal", "to": ["+15550000001"],
            "content": {"text": "hi"}, **extra}


def test_a_parked_tasks_counts_and_turn_are_read_back() -> None:
    parsed = parse_outbound(task(parkCount=2, priorAttempts=1, bucketTurn=True))
    assert (parsed["parkCount"], parsed["priorAttempts"], parsed.get("bucketTurn")) == (2, 1, True)
    fresh = parse_outbound(task())
    assert (fresh["parkCount"], fresh["priorAttempts"], "bucketTurn" in fresh) == (0, 0, False)


@pytest.mark.parametrize(("field", "value"), [
    ("bucketTurn", "yes"), ("bucketTurn", 1), ("bucketTurn", None),
    ("parkCount", -1), ("parkCount", True), ("priorAttempts", "2"),
])
def test_a_parked_tasks_field_of_the_wrong_type_is_malformed(field: str, value: Any) -> None:
    with pytest.raises(MalformedPayload, match=field):
        parse_outbound(task(**{field: value}))

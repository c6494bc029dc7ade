"""Timeline rows about one outbound task (a recipient on a channel), as the stages that
handle such tasks (delivery, ai) write them, and the rows of a cancel (api, scheduler)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from notifkit.db.logs import Kind, LogRow, Status
from notifkit.messages import OutboundTask
from notifkit.worker import attempts_before


def task_row(
    task: OutboundTask, attempt: int, kind: Kind, status: Status, detail: str,
    provider: str | None = None, provider_message_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> LogRow:
    # A replayed task's attempts are numbered after those made before its replay: rows of
    # the same number would be dropped as repeats of the first round's.
    return LogRow(
        project_id=task["projectId"], event_id=task["eventId"], task_id=task["taskId"],
        user_id=task["userId"], channel=task["channel"],
        attempt=attempts_before(task) + attempt, kind=kind,
        status=status, detail=detail, provider=provider,
        provider_message_id=provider_message_id, campaign_id=task.get("campaignId"),
        metadata=metadata or {},
    )


CANCELED_BY_CALLER = "canceled by the API caller"


def canceled_row(
    project_id: str, event_id: str, task_id: str, user_id: str | None, channel: str,
    campaign_id: str | None, when: str,
) -> LogRow:
    """The row of a task a cancel dropped (``when``: " before it was due", ...), or with
    ``channel`` '' and the event id as task, of the cancel itself.
    Attempt 0 whoever writes it, so the API and the scheduler record it once between them."""
    return LogRow(
        project_id=project_id, event_id=event_id, task_id=task_id, user_id=user_id,
        channel=channel, kind=Kind.CANCELED, status=Status.SKIPPED,
        detail=CANCELED_BY_CALLER + when, campaign_id=campaign_id,
    )


Recipient = tuple[str, str, str]  # project id, event id, user id


def went_out(rows: Iterable[Mapping[str, Any]]) -> set[Recipient]:
    """Of recipients' task rows (:func:`notifkit.db.logs.recipient_task_rows`), the
    recipients something of the notification went out to, or may still: a task handed to
    delivery (queued there, or tried: its attempts count from 1, whatever happened next), or
    one still scheduled that no cancel dropped (moved to delivery meanwhile, or on its way to
    a scheduler that drops it and looks again then)."""
    tasks: dict[tuple[Recipient, str], set[str]] = {}
    for row in rows:
        recipient = (str(row["project_id"]), str(row["event_id"]), str(row["user_id"]))
        marks = tasks.setdefault((recipient, str(row["task_id"])), set())
        if row["kind"] == Kind.QUEUED or row["attempt"] > 0:
            marks.add("handed")
        if row["status"] == Status.SCHEDULED:
            marks.add("scheduled")
        if row["kind"] == Kind.CANCELED:
            marks.add("canceled")
    return {recipient for (recipient, _task), marks in tasks.items()
            if "handed" in marks or ("scheduled" in marks and "canceled" not in marks)}

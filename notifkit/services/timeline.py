"""Timeline rows about one outbound task (a recipient on a channel), as the stages that
handle such tasks (delivery, ai) write them, and the rows of a cancel (api, scheduler)."""

from __future__ import annotations

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

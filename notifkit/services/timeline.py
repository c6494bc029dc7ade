"""Timeline rows about one outbound task (a recipient on a channel), as the stages that
handle such tasks (delivery, ai) write them."""

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

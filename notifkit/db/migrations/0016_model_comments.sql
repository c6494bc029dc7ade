-- 0015_model_comments: two comments say what their columns hold today.
--
-- notifications.status was described as the summary of the whole send. It is written once, as
-- 'accepted', and never updated (the enricher's accepted -> processing UPDATE went, for the
-- statement and WAL flush it cost every send): GET /v1/notifications/{eventId} derives the
-- send's status, and each recipient's, from message_logs. workflow_digests' comment named
-- step_index in the key of an open window; since 0005 it is step_path.

COMMENT ON TABLE notifications IS
    'One row per accepted POST /v1/notifications (or workflow send step); id is the eventId '
    '(UUIDv7). The status of the send and of each recipient is derived from message_logs, '
    'as GET /v1/notifications/{eventId} shows it.';
COMMENT ON COLUMN notifications.status IS
    'Always ''accepted'', as written at acceptance, and never updated: the send''s status is '
    'derived from its message_logs rows (the latest row of each task+channel; the send '
    'summarises its recipients).';

COMMENT ON TABLE workflow_digests IS
    'Open digest windows. The first instance to reach a digest step opens the window and owns '
    'it; instances arriving before window_ends_at append {"data", "at", "atMicros", '
    '"instanceId"} to items and stop (items are ordered by at, atMicros, instanceId: the '
    'trigger''s time and the instance, see trigger_order). At most one open window per '
    '(project, workflow, user, step path): INSERT ... ON CONFLICT (project_id, workflow_id, '
    'user_id, step_path) WHERE closed_at IS NULL DO UPDATE SET items = ... || EXCLUDED.items. '
    'The owner sets closed_at when it sends; closed windows stay.';

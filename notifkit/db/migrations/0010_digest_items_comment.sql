-- 0010_digest_items_comment: workflow_digests' comment names what an item holds today.
--
-- Items gained atMicros and instanceId (the order of triggers sharing a millisecond); the
-- table's comment still described the first shape.

COMMENT ON TABLE workflow_digests IS
    'Open digest windows. The first instance to reach a digest step opens the window and owns '
    'it; instances arriving before window_ends_at append {"data", "at", "atMicros", '
    '"instanceId"} to items and stop (items are ordered by at, atMicros, instanceId: the '
    'trigger''s time and the instance, see trigger_order). At most one open window per '
    '(project, workflow, user, step): INSERT ... ON CONFLICT (project_id, workflow_id, user_id, '
    'step_index) WHERE closed_at IS NULL DO UPDATE SET items = workflow_digests.items || '
    'EXCLUDED.items. The owner sets closed_at when it sends.';

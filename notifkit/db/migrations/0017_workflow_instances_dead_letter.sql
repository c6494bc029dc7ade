-- 0017_workflow_instances_dead_letter: an instance whose stream entry was dead-lettered says so.
--
-- A trigger or wake given up on (moved to the DLQ) left its instance pending, running or
-- waiting for good, with nothing saying it had failed. The events service, which gets the
-- failure written atomically with the DLQ move, now marks the instance failed and keeps here
-- why and the status it had, so a DLQ replay of the entry puts the instance back where it was.

ALTER TABLE workflow_instances ADD COLUMN dead_letter jsonb;
COMMENT ON COLUMN workflow_instances.dead_letter IS
    'Set when a stream entry of the instance was dead-lettered and the instance marked failed: '
    '{"error", "status"} (status: the one it had then, restored by a DLQ replay of the entry). '
    'NULL otherwise.';

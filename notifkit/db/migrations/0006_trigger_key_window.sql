-- 0006_trigger_key_window: a workflow trigger's idempotency key holds for 24 h, as a send's
-- does, instead of for ever. No data changes: a trigger with a key whose instance is older
-- than that takes the key from it (sets the old row's idempotency_key NULL) in the
-- transaction that inserts its own instance, so the unique (project_id, idempotency_key)
-- still lets one instance at a time hold a key.

COMMENT ON TABLE workflow_instances IS
    'One run of a workflow for one user; id is the instanceId (UUIDv7). status: running, '
    'waiting, completed, stopped, failed. A repeated trigger with the same idempotency key '
    'within 24 h finds the existing row (INSERT ... ON CONFLICT (project_id, idempotency_key) '
    'DO NOTHING); after that it starts a new instance, which takes the key.';
COMMENT ON COLUMN workflow_instances.idempotency_key IS
    'The x-idempotency-key of the trigger that started the instance, for 24 h: a later trigger '
    'with the key sets it NULL here in the transaction that inserts the instance it starts.';

-- 0018_notifications_idempotency_idx: a send's idempotency key is found by index.
--
-- The API keeps a caller's x-idempotency-key in Redis. When Redis loses its data, for the 24 h
-- after the loss a key Redis does not know is looked up here (project, key, created within
-- 24 h) before a send is accepted, so a retry of a send accepted before the loss replays its
-- first answer instead of sending again. Not unique: a key may be used again after 24 h, and
-- a workflow's sends carry keys of their own. Partial: most sends have no key.
-- Built inside the migration's transaction (not CONCURRENTLY), so writes to notifications
-- wait while it is built: on a large table, run the migration at a quiet time.

CREATE INDEX notifications_idempotency_idx
    ON notifications (project_id, idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;
COMMENT ON INDEX notifications_idempotency_idx IS
    'The API''s lookup of a send by its caller''s idempotency key, made only for 24 h after '
    'Redis lost its data (notif:idempotency:since younger than that).';

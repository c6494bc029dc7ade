-- 0007_suppression_ids: suppressions get an id, so the API can list them and delete one
-- (GET /v1/suppressions, DELETE /v1/suppressions/{suppressionId}).
--
-- The key stays (project_id, channel, target): every writer inserts with ON CONFLICT on it,
-- and the engine and delivery look addresses up by it. The id is only the API's handle on a
-- row; existing rows get one here. A volatile default rewrites the table once, under its
-- lock: the table holds one row per address ever suppressed, which is small.

ALTER TABLE suppressions ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid();
CREATE UNIQUE INDEX suppressions_id_idx ON suppressions (project_id, id);
-- GET /v1/suppressions: the project's rows newest first, a page at a time.
CREATE INDEX suppressions_created_idx ON suppressions (project_id, created_at DESC, id DESC);
COMMENT ON COLUMN suppressions.id IS
    'The API''s id of the row (suppressionId). Deleting the row lets the address be sent to '
    'again: the engine and delivery read this table at every batch, with no cache.';

-- 0008_notification_cancel: POST /v1/notifications/{eventId}/cancel.
--
-- The cancel is recorded here first, the system of record: the scheduler reads it (locking
-- the rows FOR SHARE) in the transaction that persists a read batch's tasks and adds them to
-- their shards, and refuses the tasks of a canceled notification. The API sets it while
-- holding the row FOR UPDATE, so a batch being persisted finishes (its tasks are in their
-- shards, where the API then takes them out) before the cancel commits, and every later
-- batch sees it.

ALTER TABLE notifications ADD COLUMN canceled_at timestamptz;
COMMENT ON COLUMN notifications.canceled_at IS
    'When POST /v1/notifications/{eventId}/cancel canceled the send: none of its tasks waiting '
    'in the scheduler, or reaching it later, is sent. NULL = not canceled.';

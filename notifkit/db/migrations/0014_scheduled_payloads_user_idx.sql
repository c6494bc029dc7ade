-- 0013_scheduled_payloads_user_idx: an erased user's waiting sends found without a scan.
--
-- Erasing a user (DELETE /v1/users/{userId}) takes their sends waiting in the scheduler
-- (sendAt, quiet hours, 429 parks) out of it, looked up by the project and the payload's
-- userId. The table had no index for that, so each erasure read every waiting task of every
-- project: a large scheduled campaign made each one a scan of all of it.

CREATE INDEX scheduled_payloads_user_idx
    ON scheduled_payloads (project_id, (payload->>'userId'));
COMMENT ON INDEX scheduled_payloads_user_idx IS
    'DELETE /v1/users/{userId}: the user''s waiting sends.';

-- 0012_message_logs_outcome_idx: GET /v1/messages?status= finds the rarer outcomes by index.
--
-- A page of message_logs filtered by status was read from message_logs_project_created_idx
-- with the status as a filter: fine for statuses most rows carry (sent, delivered, ...), but
-- for failures, which a project that mostly succeeds has few of, a page meant reading every
-- row the project ever logged (the planner chose a sequential scan of the whole table). The
-- index holds only the rows of the rarer statuses, so the rows every send writes
-- (accepted, processing, sent, delivered) do not pay for it. Connections plan each statement
-- for its arguments (plan_cache_mode = force_custom_plan), so "status = $2" uses it whenever
-- $2 is one of these.

CREATE INDEX message_logs_outcome_idx
    ON message_logs (project_id, status, created_at DESC, id DESC)
    WHERE status IN ('failed', 'dead_lettered', 'throttled', 'suppressed', 'skipped',
                     'scheduled');
COMMENT ON INDEX message_logs_outcome_idx IS
    'GET /v1/messages?status= for the rarer statuses, newest first; the others are read from '
    'message_logs_project_created_idx with the status as a filter.';

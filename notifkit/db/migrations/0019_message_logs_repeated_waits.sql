-- 0019_message_logs_repeated_waits: the timeline's comment says how a repeated wait is kept.
--
-- A wait decided again within one attempt (parked again on notifkit's own rate, held again
-- for quiet hours that changed while the send waited) used to leave the first row's "until"
-- in place, since rows are unique per task, channel, attempt and kind. Writers now update
-- such a row to the latest decision (notifkit/db/logs.py); only the comment changes here.

COMMENT ON TABLE message_logs IS
    'Timeline of every decision, attempt and provider event. Writers insert with '
    'ON CONFLICT (task_id, channel, attempt, kind), so a replayed stream entry or a '
    'repeated webhook records nothing twice; a wait decided again within one attempt '
    '(rate_limited, deferred, generation_deferred) updates its row to the latest detail and '
    'metadata, metadata.repeats counting the decisions. A row about the whole event rather '
    'than one recipient+channel (e.g. accepted) uses task_id = the event id and channel = ''''.';

-- 0012_project_deletion_timeline: deleting a project deletes its timeline and AI usage too.
--
-- message_logs and ai_usage never had a foreign key to projects (a row per send or model
-- call, for the reason 0009 gives), and the trigger 0009 added deleted only notifications
-- and delivery_outbox, so a deleted project's timeline rows and token counts stayed for ever,
-- reachable by no API call and removed by nothing.

CREATE OR REPLACE FUNCTION delete_project_sends() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM notifications WHERE project_id = OLD.id;
    DELETE FROM delivery_outbox WHERE project_id = OLD.id;
    DELETE FROM message_logs WHERE project_id = OLD.id;
    DELETE FROM ai_usage WHERE project_id = OLD.id;
    RETURN OLD;
END
$$;
COMMENT ON FUNCTION delete_project_sends() IS
    'ON DELETE of a project: its notifications, delivery_outbox, message_logs and ai_usage '
    'rows go with it (these tables have no foreign key to projects, 0009).';

-- 0009_send_path_checks: no per-row foreign-key check on the tables every send writes.
--
-- notifications and delivery_outbox each get a row per send (and the outbox an update), and a
-- foreign key to projects checks every one of them with a query that locks the project's row
-- FOR KEY SHARE: with many sends of one project committing at once, those shared locks become
-- multixacts, the costliest part of the insert. The project id on these rows never comes from
-- a caller: it is the one the API key belongs to, or the one a stream entry carries from it.
-- message_logs never had the check, for the same reason.
--
-- What the foreign keys also did is kept: deleting a project deletes its sends and outbox rows
-- (once, per deleted project, instead of a check per inserted row).

ALTER TABLE notifications DROP CONSTRAINT notifications_project_id_fkey;
ALTER TABLE delivery_outbox DROP CONSTRAINT delivery_outbox_project_id_fkey;

CREATE FUNCTION delete_project_sends() RETURNS trigger LANGUAGE plpgsql
    -- The schema it was created in, whatever the deleting session's search_path.
    SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM notifications WHERE project_id = OLD.id;
    DELETE FROM delivery_outbox WHERE project_id = OLD.id;
    RETURN OLD;
END
$$;
COMMENT ON FUNCTION delete_project_sends() IS
    'ON DELETE of a project: its notifications and delivery_outbox rows go with it, as the '
    'foreign keys 0009 removed made them.';

CREATE TRIGGER projects_delete_sends AFTER DELETE ON projects
    FOR EACH ROW EXECUTE FUNCTION delete_project_sends();

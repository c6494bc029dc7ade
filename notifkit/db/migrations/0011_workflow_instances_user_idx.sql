-- 0011_workflow_instances_user_idx: a user's workflow instances found without a scan.
--
-- Erasing a user (DELETE /v1/users/{userId}) cancels their unfinished instances, looked up by
-- (project_id, user_id). The table keeps every finished instance, so without an index each
-- erasure would read all of them.

CREATE INDEX workflow_instances_user_idx ON workflow_instances (project_id, user_id);

-- 0005_workflow_paths: what the workflow and AI services need beyond 0001.
--
-- Step paths. A step is addressed by its place in the definition: top-level steps are "0",
-- "1", ...; the steps inside a branch are "<branch>.then.<i>" and "<branch>.else.<i>", nested
-- as deep as branches nest ("3.then.1.else.0"). Each path runs at most once per instance, so
-- it names a step row, a waiter and a digest window. step_index stays the integer the API
-- shows as steps[].index: the order in which the instance reached its steps (0, 1, 2, ...),
-- equal to the top-level position for a workflow without branches.

ALTER TABLE workflow_steps ADD COLUMN path text;
UPDATE workflow_steps SET path = step_index::text WHERE path IS NULL;
ALTER TABLE workflow_steps ALTER COLUMN path SET NOT NULL;
CREATE UNIQUE INDEX workflow_steps_path_idx ON workflow_steps (instance_id, path);
COMMENT ON COLUMN workflow_steps.path IS
    'The step''s place in the definition: "0", "1", "3.then.0", ... (unique per instance).';

ALTER TABLE workflow_instances ADD COLUMN cursor text;
COMMENT ON COLUMN workflow_instances.cursor IS
    'Path of the step the instance is at (NULL before the first step and after the last). '
    'current_step is the top-level position of that path. status also takes the value '
    'pending (created by the API, not yet picked up) and digested (its trigger was added to '
    'another instance''s digest window).';

-- Which stream entry resolved a waiter ('timeout' for a timeout), so a retried event entry
-- finds the waiters it already resolved and wakes them again instead of losing them.
ALTER TABLE workflow_waiters ADD COLUMN resolved_by text;
ALTER TABLE workflow_waiters ADD COLUMN event jsonb;
ALTER TABLE workflow_waiters ADD COLUMN path text NOT NULL DEFAULT '';
CREATE INDEX workflow_waiters_resolved_by_idx ON workflow_waiters (project_id, resolved_by)
    WHERE resolved_by IS NOT NULL;

-- Digest windows are per step path (two digests in different branches of one step differ).
ALTER TABLE workflow_digests ADD COLUMN step_path text NOT NULL DEFAULT '';
DROP INDEX workflow_digests_open_idx;
CREATE UNIQUE INDEX workflow_digests_open_idx
    ON workflow_digests (project_id, workflow_id, user_id, step_path)
    WHERE closed_at IS NULL;

-- AI usage: the generated content is kept with the tokens it cost, so a retry after a crash
-- between the model's answer and the ack re-uses the answer instead of paying for it again.
ALTER TABLE ai_usage ADD COLUMN user_id text;
ALTER TABLE ai_usage ADD COLUMN channel text;
ALTER TABLE ai_usage ADD COLUMN content jsonb;
COMMENT ON COLUMN ai_usage.content IS 'The channel content written from the model''s answer.';

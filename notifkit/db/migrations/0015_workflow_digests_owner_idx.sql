-- 0014_workflow_digests_owner_idx: a digest window found by its owner without a scan.
--
-- When a digest window ends, its owner instance reads the window back by (owner instance,
-- step path), and cancelling an instance closes the windows it owns. workflow_digests keeps
-- every window ever opened, and its only index was the partial one over open windows, so each
-- of these read every window of the project; deleting an instance (ON DELETE CASCADE through
-- owner_instance_id) read the whole table. Instance ids are globally unique, so the index
-- starts with the owner.

CREATE INDEX workflow_digests_owner_idx ON workflow_digests (owner_instance_id, step_path);
COMMENT ON INDEX workflow_digests_owner_idx IS
    'The windows an instance owns: read back when the window ends, closed on cancel, and the '
    'ON DELETE CASCADE of owner_instance_id.';

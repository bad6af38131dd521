-- Migration (Gandiva): the GPUs a running job moves to, recorded with `migrate_to` when
-- a plan decides the move (NULL for a user's migration, which names only the node), so
-- that the snapshot holds them for the job while it saves its checkpoint. Both are
-- cleared when the job leaves `running` (requeued to move, ended, lost) and when the
-- checkpoint fails.
ALTER TABLE jobs ADD COLUMN migrate_gpu_uuids text[];

-- Whether the current attempt can save a checkpoint on request, as far as schedd
-- knows: NULL not known (no mini-batch reported through a shim yet, or its shim was
-- not connected when one was asked), true (its shim reports mini-batches), false (its
-- shim failed to save one this attempt). Reset by every new placement. A policy moves
-- only jobs known to be checkpointable.
ALTER TABLE jobs ADD COLUMN checkpointable boolean;

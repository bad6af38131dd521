-- Job controls through the in-job shim: the `checkpointed` state, the checkpoint a job
-- resumes from, the node a migration moves it to, its latest progress and controls.

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('pending', 'assigned', 'running', 'preempting', 'cancelling', 'checkpointed',
     'succeeded', 'failed', 'cancelled'));

-- The last checkpoint the job saved on request; its next launch resumes from it.
ALTER TABLE jobs ADD COLUMN checkpoint_path text;
-- The node the job's next placement must use (a migration's target); cleared once placed.
ALTER TABLE jobs ADD COLUMN pin_node_id text;
-- The migration a checkpoint request is for: requeue on this node once it is saved.
ALTER TABLE jobs ADD COLUMN migrate_to text;
-- What the job's shim last reported: step, steps_per_s, step times, memory.
ALTER TABLE jobs ADD COLUMN progress jsonb;
-- The share and memory cap last asked for, and whether the job is suspended.
ALTER TABLE jobs ADD COLUMN controls jsonb;

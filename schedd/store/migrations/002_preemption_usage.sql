-- Preemption (the state `preempting`), service attained over all attempts, every run
-- of every job (decayed usage for fair shares), run-time estimates from the spec.

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('pending', 'assigned', 'running', 'preempting', 'cancelling',
     'succeeded', 'failed', 'cancelled'));

-- GPU-seconds of all the job's finished attempts; the running one is added when it stops.
ALTER TABLE jobs ADD COLUMN attained_gpu_s double precision NOT NULL DEFAULT 0;
-- The spec's estimated_runtime_s, as a column so that the pending query need not read specs.
ALTER TABLE jobs ADD COLUMN estimated_runtime_s double precision;

DROP INDEX jobs_placed;
CREATE INDEX jobs_placed ON jobs (node_id)
    WHERE state IN ('assigned', 'running', 'preempting', 'cancelling');
-- A user's latest successes by job name: run-time estimates from history.
CREATE INDEX jobs_history ON jobs (user_name, name, finished_at DESC) WHERE state = 'succeeded';

-- One row per attempt that ran (from started to the end of its process, or its loss).
CREATE TABLE job_runs (
    job_id      text NOT NULL REFERENCES jobs (id),
    attempt     integer NOT NULL,
    queue       text NOT NULL,
    user_name   text NOT NULL,
    gpus        integer NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX job_runs_ended ON job_runs (ended_at);

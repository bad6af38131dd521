-- Gangs across nodes: a job too large for any one node runs as one part per node, all
-- started together. The job's row keeps its head (rank 0: `node_id`, where its logs are
-- read by default) and every GPU of every part (`gpu_uuids`); each part of an attempt is
-- a row here, with its node, its GPUs and how it ended. A job on one node has none.
CREATE TABLE job_parts (
    job_id       text NOT NULL REFERENCES jobs (id),
    attempt      integer NOT NULL,
    rank         integer NOT NULL CHECK (rank >= 0),
    node_id      text NOT NULL,
    gpu_uuids    text[] NOT NULL,
    started_at   timestamptz,
    ended_at     timestamptz,
    exit_code    integer,
    exit_signal  integer,
    -- Why it ended, where not by its own exit: could not start, or its node was lost.
    reason       text,
    lost         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, attempt, rank),
    UNIQUE (job_id, attempt, node_id)
);
-- The parts still running on a node, for its reconciliation and its loss.
CREATE INDEX job_parts_live ON job_parts (node_id) WHERE ended_at IS NULL;

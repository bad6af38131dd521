-- Users, API tokens (stored hashed), jobs, the append-only job event log, nodes, GPUs.

CREATE TABLE users (
    name        text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tokens (
    id          bigserial PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE,
    user_name   text NOT NULL REFERENCES users (name),
    role        text NOT NULL CHECK (role IN ('user', 'admin')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE jobs (
    id               text PRIMARY KEY,
    seq              bigserial NOT NULL UNIQUE,  -- submission order
    user_name        text NOT NULL,
    name             text NOT NULL,
    queue            text NOT NULL,
    priority         integer NOT NULL,
    kind             text NOT NULL,
    spec             jsonb NOT NULL,
    state            text NOT NULL CHECK (state IN
                       ('pending', 'assigned', 'running', 'cancelling',
                        'succeeded', 'failed', 'cancelled')),
    attempt          integer NOT NULL DEFAULT 0,  -- +1 at every placement
    node_id          text,
    gpu_uuids        text[] NOT NULL DEFAULT '{}',
    gpus             integer NOT NULL,
    cpus             double precision NOT NULL,
    memory_mib       integer NOT NULL,
    gpu_memory_mib   integer,
    exit_code        integer,
    exit_signal      integer,
    reason           text,
    idempotency_key  text,
    submitted_at     timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_name, idempotency_key)
);
CREATE INDEX jobs_pending ON jobs (seq) WHERE state = 'pending';
CREATE INDEX jobs_placed ON jobs (node_id) WHERE state IN ('assigned', 'running', 'cancelling');
CREATE INDEX jobs_user_seq ON jobs (user_name, seq);
CREATE INDEX jobs_state_seq ON jobs (state, seq);

CREATE TABLE job_events (
    id          bigserial PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state  text,
    to_state    text NOT NULL,
    attempt     integer NOT NULL,
    node_id     text,
    reason      text NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, id);

-- The event log is history: it is appended to, never rewritten.
CREATE FUNCTION job_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job_events is append-only';
END $$;
CREATE TRIGGER job_events_no_rewrite BEFORE UPDATE OR DELETE ON job_events
    FOR EACH ROW EXECUTE FUNCTION job_events_append_only();

CREATE TABLE nodes (
    node_id      text PRIMARY KEY,
    labels       jsonb NOT NULL DEFAULT '{}',
    cpus         double precision NOT NULL,
    memory_mib   bigint NOT NULL,
    gpu_backend  text NOT NULL,
    connected    boolean NOT NULL DEFAULT false,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE gpus (
    uuid             text PRIMARY KEY,
    node_id          text NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    index            integer NOT NULL,
    model            text NOT NULL,
    memory_mib       integer NOT NULL,
    utilization_pct  integer NOT NULL DEFAULT 0,
    memory_used_mib  integer NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gpus_node ON gpus (node_id);

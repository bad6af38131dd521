-- Time-slicing (Gandiva): when a running job was last suspended or resumed, and how
-- long its attempt has been suspended, so that its attained service and its queue's
-- usage count only the time it ran, and a policy measures its turns from a time that
-- outlives a schedd restart. Written with the `suspended` control, in one statement.

-- The current suspension's start; NULL while the job is not suspended.
ALTER TABLE jobs ADD COLUMN suspended_at timestamptz;
-- The last resume; NULL: the attempt has run since `started_at`.
ALTER TABLE jobs ADD COLUMN resumed_at timestamptz;
-- Seconds the attempt spent suspended in suspensions that have ended.
ALTER TABLE jobs ADD COLUMN paused_s double precision NOT NULL DEFAULT 0;
-- Seconds a finished run spent suspended (its last suspension included).
ALTER TABLE job_runs ADD COLUMN paused_s double precision NOT NULL DEFAULT 0;

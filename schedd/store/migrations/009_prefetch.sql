-- The node a job's inputs were last copied to ahead of its launch (a prefetch asked by
-- the scheduler or a user), so that the scheduler does not ask for the same copy again.
ALTER TABLE jobs ADD COLUMN prefetched_to text;

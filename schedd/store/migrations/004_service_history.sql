-- The service that recently finished jobs took, read for the Gittins index policies.
CREATE INDEX jobs_finished ON jobs (finished_at DESC) WHERE finished_at IS NOT NULL;

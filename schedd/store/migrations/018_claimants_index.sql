-- Each cycle reads the claimants behind the pending window (`store.jobs.pending`): the
-- few marked rows, without a pass over every pending job.
CREATE INDEX jobs_claimants ON jobs (seq) WHERE claimant;

-- Each cycle reads the claimants behind the pending window (`store.jobs.pending`): the
-- few marked rows, without a pass over every pending job. (A job cancelled while
-- marked keeps its mark: the index leaves it out.)
CREATE INDEX jobs_claimants ON jobs (seq) WHERE claimant AND state = 'pending';

-- A pending job that waits for GPUs on their way out (jobs preempted for it, or leaving
-- already), as the last plan said (`Plan.claimants`): the next plans serve it first, so
-- that those GPUs go to it. Until a plan names it no more, or it is placed.
ALTER TABLE jobs ADD COLUMN claimant boolean NOT NULL DEFAULT false;

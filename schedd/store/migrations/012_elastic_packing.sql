-- Elastic jobs and packing (Gandiva).

-- An elastic job (the spec's `min_gpus`) runs on any GPU count from `min_gpus` to
-- `max_gpus` (the spec's `gpus`); `gpus` is the count it runs on now, or is to restart
-- with. Both NULL: not elastic. A requeue that is not a move (a preemption, a lost
-- node, a resume of a checkpointed job) gives it its most again.
ALTER TABLE jobs ADD COLUMN min_gpus integer;
ALTER TABLE jobs ADD COLUMN max_gpus integer;
ALTER TABLE jobs ADD CONSTRAINT jobs_gpu_range_check CHECK (
    (min_gpus IS NULL AND max_gpus IS NULL)
    OR (min_gpus > 0 AND max_gpus >= min_gpus));

-- How busy the job keeps its GPUs while it runs alone on them (no other job running on
-- any of them), from the agents' samples, weighted by time: the figure last sampled
-- while it ran alone and when (NULL: its run alone was broken since, by a suspend, a
-- resume, another job beside it), and the seconds and percent-seconds summed over the
-- intervals between two such samples. Kept across attempts: it is the job's habit.
ALTER TABLE jobs ADD COLUMN util_alone_pct double precision;
ALTER TABLE jobs ADD COLUMN util_alone_at timestamptz;
ALTER TABLE jobs ADD COLUMN util_alone_s double precision NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN util_alone_sum double precision NOT NULL DEFAULT 0;

-- The mean step times (s) of the last progress reports that came while the job ran
-- alone on its GPUs in this attempt (its rate alone, which a pack is measured
-- against), and when its shim's progress was last reported. Reset by a new placement.
ALTER TABLE jobs ADD COLUMN step_alone_s double precision[];
ALTER TABLE jobs ADD COLUMN progress_at timestamptz;

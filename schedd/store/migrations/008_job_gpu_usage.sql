-- What a job's GPUs did while it ran, from the agents' samples: the peak memory used on
-- any of its GPUs, and the utilisation samples' count, sum and sum of squares (mean and
-- spread), for the resource estimator. Samples come when a figure changes beyond the
-- agent's threshold, so the mean is over changes, not time-weighted.
ALTER TABLE jobs ADD COLUMN gpu_memory_peak_mib integer;
ALTER TABLE jobs ADD COLUMN gpu_util_samples integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN gpu_util_sum double precision NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN gpu_util_sumsq double precision NOT NULL DEFAULT 0;

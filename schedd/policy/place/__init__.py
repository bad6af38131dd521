"""Place plugins: where a job goes."""

"""Resource estimation (Liquid): what a job will take, learned from the jobs that finished."""

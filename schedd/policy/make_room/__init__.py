"""Make-room plugins: whom to preempt so that a job can start."""

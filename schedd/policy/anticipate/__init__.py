"""Anticipate plugins: what a cycle prepares, after its decisions, for the jobs still waiting."""

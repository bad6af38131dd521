"""Decide plugins: what a cycle settles once, before any job is considered."""

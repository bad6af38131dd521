"""Admit plugins: may a job start now (quotas, limits)."""

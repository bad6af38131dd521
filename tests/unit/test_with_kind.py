"""`snapshot.with_kind` is `dataclasses.replace(job, kind=...)`, every field kept."""

from __future__ import annotations

import dataclasses

from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC, PendingJob, Request, with_kind


def test_every_field_but_the_kind_is_kept() -> None:
    # No field at its default: a field the copy dropped or moved would show.
    job = PendingJob(
        "j1",
        "alice",
        "org/team",
        3,
        OPPORTUNISTIC,
        Request(2, 8.0, 64_000, 40_000, "n1"),
        1_000.0,
        name="bert",
        estimate_s=600.0,
        attained_s=120.0,
        deadline=5_000.0,
        deadline_admitted=True,
        inputs=("s3://bucket/data",),
        prefetched_to="n2",
        stay_guaranteed=True,
        spec_kind=OPPORTUNISTIC,
        gpu_range=(1, 2),
        resume_on=("n1-g0", "n1-g1"),
        predicted_gpu_memory_mib=12_000,
    )
    defaults = PendingJob("x", "u", "q", 0, GUARANTEED, Request(1, 1.0, 1), 0.0)
    for f in dataclasses.fields(PendingJob):
        assert getattr(job, f.name) != getattr(defaults, f.name) or f.name == "kind", f.name
    made = with_kind(job, GUARANTEED)
    assert made == dataclasses.replace(job, kind=GUARANTEED)
    assert made.kind == GUARANTEED and job.kind == OPPORTUNISTIC

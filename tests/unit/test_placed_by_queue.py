"""The placed jobs by tenant queue (`victims.placed_by_queue`), kept from one snapshot to
the next: each queue's list holds exactly its placed jobs, and a queue whose jobs did not
change keeps its list object (what is kept per list, such as the Gittins victims' ranks
and `protection_ends`, depends on it). Driven by random starts, stops and job views made
again, as the simulator's snapshots change from instant to instant."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy.make_room.victims import placed_by_queue, protection_ends
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PlacedJob
from schedd.policy.view import View
from tests.unit.policy_harness import node, placed, snapshot

QUEUES = ("a", "b", "c")
NODES = [node(f"n{i}", 8) for i in range(4)]
MIN_RUN = Settings().min_run_s

# (what, queue, which job, start time): start a job in the queue, stop the job at that
# place in the list, or make that job's view again (a new object, as after a checkpoint).
steps = st.lists(
    st.tuples(
        st.sampled_from(["start", "stop", "again"]),
        st.sampled_from(QUEUES),
        st.integers(0, 50),
        st.sampled_from([0.0, 500.0, 900.0, 990.0]),
    ),
    min_size=1,
    max_size=60,
)


def view_of(jobs: list[PlacedJob]) -> View:
    return View.build(snapshot(NODES, [], list(jobs)), 1000.0, Settings())


@settings(max_examples=150, deadline=None)
@given(steps)
def test_each_queue_lists_its_jobs_and_keeps_its_list_while_they_stay(
    changes: list[tuple[str, str, int, float]],
) -> None:
    jobs: list[PlacedJob] = []
    made = 0
    before = placed_by_queue(view_of(jobs))
    for what, queue, which, started in changes:
        changed: set[str] = set()
        if what == "start":
            made += 1
            jobs.append(
                placed(f"j{made}", NODES[made % 4], [made % 8], queue=queue, started_at=started)
            )
            changed.add(queue)
        elif jobs:
            i = which % len(jobs)
            changed.add(jobs[i].queue)
            if what == "stop":
                del jobs[i]
            else:
                jobs[i] = dataclasses.replace(jobs[i], started_at=started)
        view = view_of(jobs)
        now = placed_by_queue(view)
        assert {q: {id(j) for j in js} for q, js in now.items()} == {
            q: {id(j) for j in jobs if j.queue == q} for q in {j.queue for j in jobs}
        }
        assert all(len(js) == len({id(j) for j in js}) for js in now.values())
        for q, js in now.items():
            if q not in changed and q in before:
                assert js is before[q]  # untouched: the very list
        ends = [j.started_at + MIN_RUN for j in jobs if j.started_at is not None]
        assert protection_ends(view) == min((e for e in ends if e > 1000.0), default=None)
        before = now

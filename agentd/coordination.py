"""One AntMan coordinator per GPU inside the agent: feeds them, applies what they decide.

`Coordination` is a job observer (agentd/job_observers.py): the runner says when a job
starts and ends, the shim server what its shim says. It keeps one `GpuCoordinator` per
GPU that has a job, made when the first job arrives and dropped when the last one
leaves, and feeds it the jobs that join and leave and the shims' step reports. Each
`Decision` it gets back is applied to the job's shim socket, logged, and reported to
schedd as a `JobControlled(event="limits")`.

- A job on several GPUs joins the coordinator of each. Its shim has one setting, so it
  gets the stricter of what they want: the lowest share and the smallest cap.
- Time-slicing puts a second guaranteed job on a GPU whose guaranteed job is suspended.
  A suspended guaranteed job leaves its GPUs' coordinators (`suspended`), so that the
  one whose turn it is there is the one protected; a guaranteed job that finds another
  on a GPU waits, uncoordinated there, and joins when that one is suspended or ends.
- Only a GPU with a guaranteed job and opportunistic ones is steered; the coordinator
  returns no decisions for any other.
- schedd's limits for an opportunistic job its GPUs' coordinators steer (`bound`) are
  the most they give it, here or alone on a GPU; not its setting, which they still
  choose below that. For any other job the limits are its setting, as they stand.
- After an agent restart the runner calls `job_started` for each job it finds running
  (before its socket is open again), so every job a shim says `hello` for is known; a
  `hello` of a job that has not started here is ignored. `job_started` takes what the
  shim applies from its latest `hello`, if one came first. What a decision asked while
  a job's socket was not open is sent when its shim connects; a shim that connects
  still applying what the previous agent asked is set to what the coordinators want.
- A coordinator that raises is logged; the others, and the shim server, carry on.

It does no I/O of its own and starts no task: it is called in the event loop, and the
shim server holds a setting until the job's shim connects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from agentd.coordinator import (
    CoordinatorSettings,
    CoordinatorState,
    Decision,
    GpuCoordinator,
    JobKind,
    limits_words,
)
from agentd.shim_server import ShimServer
from shared import logging
from shared.protocol import JobControlled, Msg
from shared.shim_protocol import FromShim, Hello, Step

log = logging.get("coordination")

Setting = tuple[int, int | None]  # (share 0-100, memory cap in MiB or None)


@dataclass
class _Job:
    kind: str
    uuids: list[str]  # its GPUs
    gpus: list[str] = field(default_factory=list)  # the GPUs whose coordinator it joined
    suspended: bool = False  # by schedd (time-slicing, or a user), not by a coordinator


class Coordination:
    def __init__(
        self,
        shims: ShimServer,
        post: Callable[[Msg], None],
        gpu_memory_mib: dict[str, int],
        settings: CoordinatorSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`gpu_memory_mib`: each GPU's total memory by UUID, from the inventory."""
        self.shims = shims
        self.post = post
        self.gpu_memory_mib = dict(gpu_memory_mib)
        self.settings = settings or CoordinatorSettings()
        self.clock = clock
        self._coordinators: dict[str, GpuCoordinator] = {}
        self._jobs: dict[str, _Job] = {}
        self._sent: dict[str, Setting] = {}  # what the shim server holds, as set from here

    # ---- the job observer --------------------------------------------------------------

    def job_started(self, key: str, kind: str, gpu_uuids: list[str]) -> None:
        """A job started on this node, or a restarted agent found it running."""
        if key in self._jobs:
            log.warning("job already coordinated", job_key=key)
            return
        job = self._jobs[key] = _Job(kind, list(dict.fromkeys(gpu_uuids)))  # once per GPU
        decisions = self._join(key, job)
        self._drop_idle(gpu_uuids)
        self._handle(decisions)

    def suspended(self, key: str, suspended: bool) -> None:
        """schedd suspended (or resumed) the job. A guaranteed job leaves its GPUs'
        coordinators while suspended: another guaranteed job may take its turn there
        (time-slicing), and it joins them in the suspended one's place. Resumed, it joins
        again where no other guaranteed job is. An opportunistic job stays: its share is
        steered as before, and applies once it runs again."""
        job = self._jobs.get(key)
        if job is None or job.suspended == suspended:
            return  # not coordinated here, or a repeated control (a reconnect sends it)
        job.suspended = suspended
        if job.kind != "guaranteed":
            return
        if not suspended:
            self._handle(self._join(key, job))
            return
        now = self.clock()
        decisions: list[Decision] = []
        left, job.gpus = job.gpus, []
        for uuid in left:
            decisions += (
                self._ask(uuid, key, partial(self._coordinators[uuid].job_left, key, now)) or []
            )
        decisions += self._join_waiting(left)
        self._drop_idle(left)
        self._handle(decisions)

    def on_shim_event(self, key: str, msg: FromShim) -> None:
        """The shim server's events: steps feed the coordinators; a hello resyncs the job."""
        job = self._jobs.get(key)
        if job is None:
            return  # not started here: job_started comes first, for recovered jobs too
        match msg:
            case Step():
                now = self.clock()
                decisions: list[Decision] = []
                for uuid in job.gpus:
                    step = self._coordinators[uuid].step
                    ask = partial(step, key, msg.wall_s, msg.mem_peak_mib, now)
                    decisions += self._ask(uuid, key, ask) or []
                self._handle(decisions)
            case Hello():
                self._resync(key, msg)

    def job_ended(self, key: str) -> None:
        """The job exited, was killed, or checkpointed and exited; unknown jobs are ignored."""
        job = self._jobs.pop(key, None)
        self._sent.pop(key, None)
        if job is None:
            return
        now = self.clock()
        decisions: list[Decision] = []
        for uuid in job.gpus:
            left = partial(self._coordinators[uuid].job_left, key, now)
            decisions += self._ask(uuid, key, left) or []
        if job.kind == "guaranteed":
            decisions += self._join_waiting(job.gpus)
        self._drop_idle(job.gpus)
        self._handle(decisions)

    def bound(self, key: str, share: int, memory_cap_mib: int | None) -> bool:
        """schedd's limits for an opportunistic job its GPUs' coordinators steer: the most
        they may give it (share 100 and no cap: no bound). False, and nothing done, for
        any other job, whose limits schedd's controls apply as they stand."""
        job = self._jobs.get(key)
        if job is None or job.kind != "opportunistic" or not job.gpus:
            return False
        now = self.clock()
        decisions: list[Decision] = []
        for uuid in job.gpus:
            set_bound = partial(self._coordinators[uuid].set_bound, key, share, memory_cap_mib, now)
            decisions += self._ask(uuid, key, set_bound) or []
        self._handle(decisions)
        return True

    def set_kind(self, key: str, kind: str) -> bool:
        """The job is now of `kind` (schedd upgraded an opportunistic job): it leaves its
        GPUs' coordinators and joins them again as that kind, and a guaranteed job is set
        free (full share, no memory cap). Refused, and the job left as it was, where one
        of its GPUs has another guaranteed job; schedd hears either outcome. True if the
        job is of `kind` now (or not coordinated here)."""
        job = self._jobs.get(key)
        if job is None or job.kind == kind:
            return True  # not coordinated here, or done already
        gpus = list(job.gpus)
        held = [
            uuid
            for uuid in gpus
            if (g := self._coordinators[uuid].state().guaranteed) is not None and g != key
        ]
        taken = not (kind == "guaranteed" and held)
        if not taken:
            why = f"not taken: GPU {held[0]} has a guaranteed job already"
            log.warning("job kind not changed", job_key=key, kind=kind, gpu=held[0])
        else:
            was_suspended = job.suspended
            self.job_ended(key)
            self.job_started(key, kind, job.uuids)
            if was_suspended:
                self.suspended(key, True)
            if kind == "guaranteed" and self.shims.is_open(key):
                self.shims.set_limits(key, share=100, memory_cap_mib=None)
            why = f"{kind}: taken by the coordinators of GPU(s) {', '.join(gpus) or 'none'}"
            log.info("job kind changed", job_key=key, kind=kind)
        job_id, attempt = _job_of(key)
        self.post(JobControlled(job_id=job_id, attempt=attempt, event="kind", detail=why))
        return taken

    def states(self) -> list[CoordinatorState]:
        """What each coordinator believes, by GPU UUID: for status pages and debugging."""
        return [self._coordinators[uuid].state() for uuid in sorted(self._coordinators)]

    # ---- coordinators ------------------------------------------------------------------

    def _join(self, key: str, job: _Job) -> list[Decision]:
        """The job joins the coordinators of its GPUs it has not joined; a guaranteed job
        none where another guaranteed job is (it takes turns with it: `suspended`)."""
        share, cap = self._shim_applies(key)
        now = self.clock()
        decisions: list[Decision] = []
        for uuid in job.uuids:
            coordinator = None if uuid in job.gpus else self._coordinator(uuid)
            if coordinator is None:
                continue
            holder = coordinator.state().guaranteed
            if job.kind == "guaranteed" and holder is not None and holder != key:
                log.info(
                    "guaranteed job waits to be coordinated", job_key=key, gpu=uuid, holder=holder
                )
                continue
            joined = self._ask(
                uuid,
                key,
                partial(
                    coordinator.job_joined,
                    key,
                    cast(JobKind, job.kind),  # the coordinator refuses any other kind
                    now,
                    applied_share=share,
                    applied_cap_mib=cap,
                ),
            )
            if joined is not None:
                job.gpus.append(uuid)
                decisions += joined
        return decisions

    def _join_waiting(self, uuids: Iterable[str]) -> list[Decision]:
        """Guaranteed jobs that wait on these GPUs (their guaranteed job was suspended or
        ended) join where they now can."""
        freed = set(uuids)
        decisions: list[Decision] = []
        for key, job in self._jobs.items():
            if (
                job.kind == "guaranteed"
                and not job.suspended
                and any(u in freed and u not in job.gpus for u in job.uuids)
            ):
                decisions += self._join(key, job)
        return decisions

    def _coordinator(self, uuid: str) -> GpuCoordinator | None:
        coordinator = self._coordinators.get(uuid)
        if coordinator is not None:
            return coordinator
        total = self.gpu_memory_mib.get(uuid)
        if total is None:
            log.warning("job on a GPU not in the inventory, not coordinated", gpu=uuid)
            return None
        coordinator = self._coordinators[uuid] = GpuCoordinator(uuid, total, self.settings)
        return coordinator

    def _drop_idle(self, uuids: Iterable[str]) -> None:
        """Forget the coordinators left without jobs: a new job starts from scratch."""
        for uuid in uuids:
            coordinator = self._coordinators.get(uuid)
            if coordinator is None:
                continue
            state = coordinator.state()
            if state.guaranteed is None and not state.opportunistic:
                del self._coordinators[uuid]

    def _ask(self, uuid: str, key: str, ask: partial[list[Decision]]) -> list[Decision] | None:
        """One call into a coordinator; None if it raised, which is logged and goes no further.

        The coordinator's bug, or the agent's misuse of it, must not cost the other GPUs
        their coordination, nor reach the shim server's event sink.
        """
        try:
            return ask()
        except Exception:
            log.exception("coordinator failed", gpu=uuid, job_key=key, call=ask.func.__name__)
            return None

    # ---- applying decisions ----------------------------------------------------------

    def _handle(self, decisions: list[Decision]) -> None:
        """Apply each affected job's setting once, then log and report every decision."""
        wanted = {key: self._wanted(key) for key in dict.fromkeys(d.job_key for d in decisions)}
        for key, setting in wanted.items():
            self._apply(key, setting)
        for d in decisions:
            self._report(d, wanted[d.job_key])

    def _wanted(self, key: str) -> Setting | None:
        """The stricter of what the job's coordinators want; None where none steers it."""
        job = self._jobs.get(key)
        settings = [
            setting
            for uuid in (job.gpus if job is not None else [])
            if (setting := self._coordinators[uuid].state().opportunistic.get(key)) is not None
        ]
        if not settings:
            return None
        caps = [cap for _, cap in settings if cap is not None]
        return min(share for share, _ in settings), min(caps) if caps else None

    def _apply(self, key: str, setting: Setting | None) -> bool:
        """Hand the job's setting to its socket unless it holds it already; True if sent.

        A job whose socket is not open (an agent that restarts opens them after it has
        found the jobs) gets it when its shim connects, from `_resync`.
        """
        if setting is None or self._sent.get(key) == setting or not self.shims.is_open(key):
            return False
        share, cap = setting
        try:
            self.shims.set_limits(key, share=share, memory_cap_mib=cap)
        except (KeyError, ValueError):
            log.exception("coordinator setting not applied", job_key=key, share=share, cap=cap)
            return False
        self._sent[key] = setting
        return True

    def _report(self, d: Decision, setting: Setting | None) -> None:
        job_id, attempt = _job_of(d.job_key)
        log.info(
            "coordinator decision",
            gpu=d.gpu_uuid,
            job_id=job_id,
            attempt=attempt,
            share=d.share,
            memory_cap_mib=d.memory_cap_mib,
            previous_share=d.previous_share,
            previous_memory_cap_mib=d.previous_memory_cap_mib,
            # The job's setting over all its GPUs: another GPU's may be stricter.
            job_setting=None if setting is None else list(setting),
            reason=d.reason,
        )
        detail = f"coordinator on GPU {d.gpu_uuid}: {d.reason}"
        self.post(JobControlled(job_id=job_id, attempt=attempt, event="limits", detail=detail))

    def _resync(self, key: str, hello: Hello) -> None:
        """A shim connected: make it apply what the coordinators want for its job.

        The shim server resends what it holds on every connect, so this only acts after
        an agent restart (the shim still applies what the previous agent asked) or when a
        decision came while the job's socket was not open.
        """
        wanted = self._wanted(key)
        held = self._sent.get(key)
        applying = (hello.share, hello.memory_cap_mib) if held is None else held
        if wanted is None or applying == wanted:
            return
        self._sent.pop(key, None)
        if not self._apply(key, wanted):
            return
        job_id, attempt = _job_of(key)
        detail = (
            "coordinator: the job's shim connected applying "
            f"{limits_words(hello.share, hello.memory_cap_mib)}; set to {limits_words(*wanted)}, "
            "as the coordinators of its GPUs have it"
        )
        log.info("coordinator setting resent", job_id=job_id, attempt=attempt, detail=detail)
        self.post(JobControlled(job_id=job_id, attempt=attempt, event="limits", detail=detail))

    def _shim_applies(self, key: str) -> Setting:
        """What the job's shim applies now, if it has said hello; else the shim's defaults."""
        hello = self.shims.hello(key)
        return (100, None) if hello is None else (hello.share, hello.memory_cap_mib)


def _job_of(key: str) -> tuple[str, int]:
    job_id, _, attempt = key.rpartition(".")
    return (job_id, int(attempt)) if job_id and attempt.isdigit() else (key, 0)

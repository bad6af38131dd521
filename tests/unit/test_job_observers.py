"""Every observer hears every event of a job; one that raises does not silence the rest."""

from __future__ import annotations

from agentd.job_observers import JobObservers
from shared.shim_protocol import FromShim, Resumed


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.heard: list[tuple[str, ...]] = []
        self.fail = fail

    def job_started(self, key: str, kind: str, gpu_uuids: list[str]) -> None:
        self.heard.append(("started", key, kind, *gpu_uuids))
        if self.fail:
            raise RuntimeError("observer bug")

    def on_shim_event(self, key: str, msg: FromShim) -> None:
        self.heard.append(("event", key, type(msg).__name__))
        if self.fail:
            raise RuntimeError("observer bug")

    def job_ended(self, key: str) -> None:
        self.heard.append(("ended", key))
        if self.fail:
            raise RuntimeError("observer bug")


def test_every_observer_hears_every_event_even_after_one_raises() -> None:
    broken, working = Recorder(fail=True), Recorder()
    observers = JobObservers(broken, working)
    observers.job_started("j", 2, "opportunistic", ["GPU-a"])
    observers.on_shim_event("j.2", Resumed(step=5))
    observers.job_ended("j", 2)
    expected = [
        ("started", "j.2", "opportunistic", "GPU-a"),
        ("event", "j.2", "Resumed"),
        ("ended", "j.2"),
    ]
    assert broken.heard == expected and working.heard == expected

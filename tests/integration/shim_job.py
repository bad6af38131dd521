"""A small training loop on the CPU that uses the shim: the job the shim tests drive.

Usage: python -S shim_job.py STEPS WORK [PAUSE], with shim.py copied beside it (as into
a job image; -S keeps site-packages out, so the shim must get by on the standard
library). STEPS 0 runs until stopped; WORK is the pure-Python work of one step (loop
turns); PAUSE, seconds between steps (input waits, say: the GPU idles meanwhile).
It prints `{"started_at": N}` and, when done, `{"finished_at": N}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import shim  # type: ignore[import-not-found]  # the copy beside this file


def main() -> None:
    steps, work = int(sys.argv[1]), int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    state = {"step": 0, "weight": 1.0}
    resumed = shim.resume_state()
    if resumed is not None:
        state = json.loads((Path(resumed.path) / "state.json").read_text())

    def save(directory: str) -> None:
        (Path(directory) / "state.json").write_text(json.dumps(state))

    shim.on_checkpoint(save)
    print(json.dumps({"started_at": state["step"]}), flush=True)
    while steps == 0 or state["step"] < steps:
        with shim.step():
            weight = state["weight"]
            for i in range(work):
                weight = weight * 0.999 + i * 1e-9
            state["weight"] = weight
            state["step"] += 1
        if pause:
            time.sleep(pause)
    print(json.dumps({"finished_at": state["step"]}), flush=True)


if __name__ == "__main__":
    main()

"""PNG plots of one or more runs: the JCT CDF and GPU allocation over time.

matplotlib is imported here only, inside the functions, so that nothing else (the live
daemons least of all) pays for importing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schedd.sim.metrics import Summary
from schedd.sim.outcome import SimResult
from schedd.sim.units import UNITS


def write_plots(
    runs: Sequence[tuple[SimResult, Summary]], directory: str | Path, unit: str
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    scale = UNITS[unit]
    title = Path(runs[0][0].trace.path).name if runs else ""
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result, _ in runs:
        jcts = sorted(j.jct_s / scale for j in result.jobs if j.jct_s is not None)
        if jcts:
            fractions = [(i + 1) / len(jcts) for i in range(len(jcts))]
            ax.step(jcts, fractions, where="post", label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel(f"job completion time ({unit}, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_title(f"JCT CDF, {title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = out / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for _, summary in runs:
        times = [t / scale for t, _ in summary.allocation_series]
        values = [100 * v for _, v in summary.allocation_series]
        ax.step(times, values, where="post", label=summary.policy)
    ax.set_xlabel(f"time since the first submission ({unit})")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"GPU allocation over time, {title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = out / "allocation.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written

"""A bundle of resources (GPUs, CPUs, memory, GPU memory) with the arithmetic quotas and
DRF need.

A job's GPU memory is what it asks for, per GPU times its GPUs (`Request.resources`); a
job that asks none counts none, and is bounded by its GPUs alone.
"""

from __future__ import annotations

from schedd.policy.immutable import immutable


@immutable
class Resources:
    gpus: int = 0
    cpus: float = 0.0
    memory_mib: int = 0
    gpu_memory_mib: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus + other.gpus,
            self.cpus + other.cpus,
            self.memory_mib + other.memory_mib,
            self.gpu_memory_mib + other.gpu_memory_mib,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus - other.gpus,
            self.cpus - other.cpus,
            self.memory_mib - other.memory_mib,
            self.gpu_memory_mib - other.gpu_memory_mib,
        )

    def exceeds_with(self, more: Resources, limit: Resources) -> str | None:
        """The first dimension `more` adds to that `self + more` would take over a quota
        `limit`, in words, or None (without building the sum: quota admission asks it
        for every job a plan considers). A dimension `more` adds nothing to refuses
        nothing, though `self` be over it already (a max lowered since, say): a job that
        asks no GPU memory is bounded by GPUs alone.

        GPUs are always limited; a quota's CPUs, memory or GPU memory of 0 mean "not
        limited", since most quotas are written in GPUs alone.
        """
        if more.gpus > 0 and self.gpus + more.gpus > limit.gpus:
            return f"{self.gpus + more.gpus} GPUs > {limit.gpus}"
        cpus = self.cpus + more.cpus
        if more.cpus > 0 and limit.cpus > 0 and cpus > limit.cpus + 1e-9:
            return f"{cpus:g} CPUs > {limit.cpus:g}"
        memory_mib = self.memory_mib + more.memory_mib
        if more.memory_mib > 0 and limit.memory_mib > 0 and memory_mib > limit.memory_mib:
            return f"{memory_mib} MiB > {limit.memory_mib} MiB"
        gpu_memory_mib = self.gpu_memory_mib + more.gpu_memory_mib
        if more.gpu_memory_mib > 0 and 0 < limit.gpu_memory_mib < gpu_memory_mib:
            return f"{gpu_memory_mib} MiB of GPU memory > {limit.gpu_memory_mib} MiB"
        return None

    def keeps(self, guarantee: Resources, gpus: bool = True) -> bool:
        """Whether holding this leaves a queue at or above `guarantee`: in GPUs (unless
        not `gpus`), and in CPUs, memory and GPU memory where it sets them (above 0)."""
        g = guarantee
        return (
            (not gpus or self.gpus >= g.gpus)
            and (g.cpus <= 0 or self.cpus + 1e-9 >= g.cpus)
            and (g.memory_mib <= 0 or self.memory_mib >= g.memory_mib)
            and (g.gpu_memory_mib <= 0 or self.gpu_memory_mib >= g.gpu_memory_mib)
        )

    def within_others(self, guarantee: Resources) -> bool:
        """Whether this stays within `guarantee` in the CPUs, memory and GPU memory it
        sets (above 0); GPUs are not looked at."""
        g = guarantee
        return (
            (g.cpus <= 0 or self.cpus <= g.cpus + 1e-9)
            and (g.memory_mib <= 0 or self.memory_mib <= g.memory_mib)
            and (g.gpu_memory_mib <= 0 or self.gpu_memory_mib <= g.gpu_memory_mib)
        )

    def sets_others(self) -> bool:
        """Whether, as a guarantee, it sets any CPUs, memory or GPU memory."""
        return self.cpus > 0 or self.memory_mib > 0 or self.gpu_memory_mib > 0

    def dominant_share(self, total: Resources) -> float:
        """DRF's dominant share: the largest fraction of the cluster's GPUs, CPUs or
        memory. Not of its GPU memory: a job holds its GPUs whole, and one that says what
        memory it needs on them would otherwise count more than one that does not."""
        share = 0.0
        if total.gpus > 0:
            share = self.gpus / total.gpus
        if total.cpus > 0 and self.cpus / total.cpus > share:
            share = self.cpus / total.cpus
        if total.memory_mib > 0 and self.memory_mib / total.memory_mib > share:
            share = self.memory_mib / total.memory_mib
        return max(share, 0.0)


NOTHING = Resources()

"""Tunables shared by the policy plugins, with their defaults; a profile may override them."""

from __future__ import annotations

from schedd.policy.immutable import immutable


@immutable
class Settings:
    # Run time assumed for a job with no estimate (reservations, backfill, SRTF).
    default_estimate_s: float = 3600.0
    # A job runs at least this long (since its start or last checkpoint) before it may
    # be preempted, so that reclaiming never turns into thrashing.
    min_run_s: float = 300.0
    # 2D-LAS (Tiresias): the attained GPU-seconds at which a job drops to the next queue.
    las_thresholds_gpu_s: tuple[float, ...] = (3200.0,)
    # The Gittins index (order.gittins) is learned once this many jobs have finished
    # (at least 32); until then the order is 2D-LAS. An index from a few dozen jobs can
    # preempt long jobs back and forth on chance clusters of finishing times
    # (docs/simulator.md); the default profile waits for 256.
    gittins_min_finished: int = 32
    # How much decayed past use counts against a group's fair share, next to what it
    # holds now (0: current allocation only).
    history_weight: float = 1.0
    # The decay half-life the shell applies to past use; used here to normalise it into
    # a share of the cluster.
    half_life_s: float = 86400.0
    # At most this many blocked jobs hold reservations in one cycle.
    reservations: int = 1
    # A blocked job gets a reservation only once it has waited this long since its
    # submission (Slurm's bf_min_age_reserve): held GPUs idle until it starts, which is
    # worth paying against starvation, not for every job that waits a moment.
    reserve_after_s: float = 0.0
    # Only jobs of at least this many GPUs get reservations (a large gang is what small
    # jobs starve; a small job finds GPUs soon enough without holding any).
    reserve_min_gpus: int = 1
    # Deadlines (Chronus): the share of the cluster's GPU-seconds that guaranteed jobs
    # may count on (gangs never fill every GPU), and how many jobs with a deadline one
    # cycle decides: undecided ones first, oldest first (the rest in the next cycles),
    # then refused ones asked again, earliest deadline first.
    deadline_efficiency: float = 0.9
    deadline_decisions: int = 256
    # Chronus's lease: besides each arrival of a job with a deadline, admission decides
    # again at the first plan of each lease (the clock cut into leases of this length):
    # refused jobs that may fit now, guarantees the cluster can no longer keep.
    deadline_lease_s: float = 1200.0
    # A guaranteed job with less slack than this (deadline - now - remaining run time)
    # goes before every other job and may preempt; with more, it takes its turn by
    # remaining time and preempts nobody, so that best-effort jobs are not kept waiting
    # for deadlines hours away. Two of Chronus's 20-minute leases.
    deadline_urgent_s: float = 2400.0
    # Network-aware placement (Liquid): what a gang's spread costs, per node, rack and
    # domain beyond the first, against the idle share of its nodes' GPUs (at most 1).
    network_cost_node: float = 1.0
    network_cost_rack: float = 4.0
    network_cost_domain: float = 16.0
    # Liquid's batch mode: at least `batch_min_jobs` jobs that arrived within
    # `batch_window_s` are packed together by a grouping GA (at most `batch_max_jobs`,
    # the oldest), within `batch_generations` of `batch_population` solutions.
    batch_window_s: float = 60.0
    batch_min_jobs: int = 4
    batch_max_jobs: int = 64
    batch_generations: int = 20
    batch_population: int = 8
    # Pre-scheduled data transfer (Liquid): the inputs of up to `prefetch_jobs` waiting
    # jobs are copied to the node expected to free GPUs for them within the horizon.
    prefetch_jobs: int = 4
    prefetch_horizon_s: float = 600.0
    # GPU sharing (AntMan): an opportunistic job goes only to GPUs whose utilisation
    # stayed below this (percent, the highest over the shell's window).
    share_below_pct: float = 50.0
    # A GPU whose guaranteed job started less than this ago, with no figure of its own
    # use, is not shared yet: the GPU's window has not seen the job run (the live
    # scheduler's gpu_window_s is the natural value).
    share_after_s: float = 300.0
    # A guaranteed job still waiting this long after its submission runs opportunistically
    # meanwhile (unless its spec opts out), and is upgraded back once the room is there.
    opportunistic_after_s: float = 1800.0
    # Time-slicing (Gandiva): a job that finds no free GPUs may take turns with a running
    # job of its GPU count, at most `timeslice_max` jobs on one set of GPUs, each turn
    # `timeslice_s` times its queue's weight (weighted round-robin). Gandiva's quantum
    # was a minute; ten minutes make fewer switches, whose cost on a GPU has not been
    # measured yet (docs/gpu.md).
    timeslice_s: float = 600.0
    timeslice_max: int = 2
    # Migration (Gandiva): what a move costs the job, in seconds of its GPUs (a checkpoint
    # saved, copied and restored); a move is made only when it buys more. Up to
    # `migrate_jobs` moves a cycle by each migration and grow/shrink plugin (defragment
    # counts the waiting jobs it makes room for). A job spread over nodes is assumed to run at
    # `spread_speed` of its speed on one node: what moving it onto one buys.
    migrate_cost_s: float = 60.0
    migrate_jobs: int = 4
    spread_speed: float = 0.8
    # Packing (Gandiva): two jobs taking turns on the same GPUs run at once instead where
    # their utilisations add up to at most `pack_below_pct`; the pack is undone when
    # their progress rates (each against its rate alone) add up to less than
    # `pack_min_progress` (1.0: no better than taking turns). The shell is asked to plan
    # again `pack_check_s` after a pack, when the rates have been measured.
    pack_below_pct: float = 90.0
    pack_min_progress: float = 1.0
    pack_check_s: float = 300.0

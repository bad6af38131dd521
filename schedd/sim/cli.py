"""`schedctl sim`: replay a trace through one or more policy profiles and report.

Bad input (an option's value, a file that is missing or malformed) is an error that
names the option and the reason, with exit status 2, as argparse's own errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from schedd.sim.shape import ClusterShape, parse_shape
from schedd.sim.traces import FORMATS
from schedd.sim.units import DEFAULT_UNIT, UNITS

DEFAULT_POLICY = "fifo"


def _shape(text: str) -> ClusterShape:
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected seconds > 0, got 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _bounded_float(
    what: str, bounds: str, within: Callable[[float], bool]
) -> Callable[[str], float]:
    """A parser of a number that is `what` ("expected {what}"), `within` its bounds
    ("expected {bounds}" otherwise)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not within(value):
            raise argparse.ArgumentTypeError(f"expected {bounds}, got {text!r}")
        return value

    return parse


_speed = _bounded_float("a relative speed", "a relative speed in (0, 1]", lambda v: 0 < v <= 1)
_fraction = _bounded_float("a fraction", "a fraction in [0, 1]", lambda v: 0 <= v <= 1)
_slowdown = _bounded_float("a fraction", "0 <= x < 1", lambda v: 0 <= v < 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, metavar="PATH", help="the trace file (CSV)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the trace's format")
    parser.add_argument(
        "--cluster", required=True, type=_shape, metavar="NODESxGPUS", help="e.g. 120x8"
    )
    parser.add_argument(
        "--rack-size",
        type=_positive_int,
        metavar="N",
        help="label every N consecutive nodes as one rack (default: no racks)",
    )
    parser.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        metavar="PROFILE",
        help="policy profile (default fifo; a wrong name lists the known ones)",
    )
    parser.add_argument(
        "--compare", metavar="A,B,C", help="run each of these profiles, report them together"
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure to OUT (seconds)")
    parser.add_argument("--plot", metavar="DIR", help="write jct_cdf.png and allocation.png")
    parser.add_argument(
        "--limit", type=_positive_int, metavar="N", help="replay only the N earliest rows"
    )
    parser.add_argument(
        "--unit", choices=sorted(UNITS), help="time unit of the table (chronus, itp: min)"
    )
    parser.add_argument(
        "--queues",
        metavar="PATH",
        help='schedd.toml (or a file of its [queues."org/team"] tables): the queues to use',
    )
    locality = parser.add_argument_group("locality: jobs whose GPUs span nodes run slower")
    locality.add_argument(
        "--model-info", metavar="PATH", help="model_info.json: speed by model, GPUs, nodes"
    )
    locality.add_argument(
        "--locality-default",
        type=_speed,
        default=1.0,
        metavar="F",
        help="speed across nodes for a model the table lacks (default 1.0: no slowdown)",
    )
    locality.add_argument(
        "--cross-rack-speed",
        type=_speed,
        default=1.0,
        metavar="F",
        help="a further factor for a job whose nodes span racks (--rack-size; default 1.0)",
    )
    locality.add_argument("--no-locality", action="store_true", help="no slowdown at all")
    costs = parser.add_argument_group("preemption, suspension, migration and resize")
    costs.add_argument(
        "--preempt-overhead",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="a preempted job holds its GPUs S seconds, doing nothing, before it requeues",
    )
    costs.add_argument(
        "--suspend-overhead",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="a resumed job makes no progress for S seconds after each resume (default 0)",
    )
    costs.add_argument(
        "--migrate-overhead",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="a migration takes S seconds end to end, without progress, the job holding"
        " its GPUs and the target's meanwhile (default 30, an assumption)",
    )
    costs.add_argument(
        "--resize-overhead",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="an elastic job's grow or shrink takes S seconds (a restart from its"
        " checkpoint), without progress, holding its GPUs and the new ones meanwhile"
        " (default 30, an assumption)",
    )
    costs.add_argument(
        "--checkpoint-interval",
        type=_positive_seconds,
        metavar="S",
        help="jobs checkpoint every S seconds; a preemption loses the work since the last",
    )
    sharing = parser.add_argument_group(
        "GPU sharing: assumed, since traces record no utilisation (see docs/simulator.md)"
    )
    sharing.add_argument(
        "--gpu-util",
        default="10-100",
        metavar="LOW-HIGH",
        help="each job keeps its GPUs busy a percentage drawn uniformly from this range"
        " (default 10-100), the same for every profile",
    )
    sharing.add_argument(
        "--share-slowdown",
        type=float,
        default=0.05,
        metavar="X",
        help="a guaranteed job sharing a GPU with an opportunistic one runs this much"
        " slower (default 0.05, the coordinator's bound)",
    )
    sharing.add_argument(
        "--pack-slowdown",
        type=_slowdown,
        default=0.1,
        metavar="X",
        help="two jobs packed on the same GPUs (Gandiva) each run at min(1, 100 / (u1 +"
        " u2)) x (1 - X) of their speed alone, u their utilisations (default 0.1, an"
        " assumption)",
    )
    parser.add_argument(
        "--elastic",
        type=_fraction,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of the jobs of more than one GPU are elastic (Gandiva's"
        " grow/shrink: any count from half their GPUs, rounded up, to all), drawn once per"
        " job, the same for every profile (default 0; an assumption: no trace says)",
    )
    parser.add_argument(
        "--estimates",
        choices=("oracle", "history", "forest"),
        help="where jobs' run-time estimates come from, for every profile (default: each"
        " profile's own): the true run times, the mean of the user's finished jobs of the"
        " same name, or the resource estimator trained on the jobs finished so far",
    )
    parser.add_argument(
        "--half-life",
        type=_positive_seconds,
        default=86_400.0,
        metavar="S",
        help="half-life of the decayed usage the policy sees (default one day)",
    )


def _profile_names(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    from schedd import policy

    option = "--compare" if args.compare else "--policy"
    names = [n.strip() for n in (args.compare or args.policy).split(",") if n.strip()]
    if not names:
        parser.error(f"{option}: expected profile names, e.g. fifo")
    for name in names:
        if name not in policy.PROFILES:
            known = ", ".join(sorted(policy.PROFILES))
            parser.error(f"{option}: unknown profile {name!r}; known: {known}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from schedd import policy
    from schedd.policy.queues import QueueSpec
    from schedd.sim import report
    from schedd.sim.engine import SimError, SimOptions
    from schedd.sim.locality import LocalityError, LocalityModel, NoLocality, load_table
    from schedd.sim.replay import replay
    from schedd.sim.sharing import SharingError, SharingModel, parse_util_range
    from schedd.sim.traces import TraceError, read_trace

    names = _profile_names(args, parser)
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            parser.error(f"{option}: {Path(path).parent}: no such directory")
    if not Path(args.trace).is_file():
        parser.error(f"--trace: {args.trace}: no such file")
    try:
        trace = read_trace(args.trace, args.format, args.limit)
    except (TraceError, OSError, UnicodeDecodeError) as exc:
        parser.error(f"--trace: {exc}")
    locality: LocalityModel = NoLocality()
    if not args.no_locality:
        try:
            table = load_table(args.model_info) if args.model_info else None
        except LocalityError as exc:
            parser.error(f"--model-info: {exc}")
        locality = LocalityModel(table, args.locality_default, args.cross_rack_speed)
    queues: tuple[QueueSpec, ...] = ()
    if args.queues:
        # The live scheduler's own reader: a whole schedd.toml does, or only its queues.
        from schedd.policy_config import queue_specs
        from shared.config import ConfigError, SchedConfig, load

        try:
            queues = queue_specs(load(SchedConfig, args.queues))
        except ConfigError as exc:
            parser.error(f"--queues: {exc}")
    try:
        low, high = parse_util_range(args.gpu_util)
        sharing = SharingModel(low, high, args.share_slowdown)
    except SharingError as exc:
        parser.error(str(exc))
    options = SimOptions(
        preempt_overhead_s=args.preempt_overhead,
        suspend_overhead_s=args.suspend_overhead,
        migrate_overhead_s=args.migrate_overhead,
        resize_overhead_s=args.resize_overhead,
        checkpoint_interval_s=args.checkpoint_interval,
        half_life_s=args.half_life,
        queues=queues,
        sharing=sharing,
        elastic=args.elastic,
        pack_slowdown=args.pack_slowdown,
    )
    profiles = [policy.profile(name) for name in names]
    if args.estimates:
        profiles = [dataclasses.replace(p, estimates=args.estimates) for p in profiles]
    shape = dataclasses.replace(args.cluster, nodes_per_rack=args.rack_size)
    try:
        runs = replay(trace, shape, profiles, options, locality)
    except SimError as exc:
        sys.exit(f"schedctl sim: {exc}")
    unit = args.unit or DEFAULT_UNIT[args.format]
    title = (
        f"{Path(args.trace).name} ({args.format}, {len(trace.jobs):,} jobs) "
        f"on {args.cluster} GPUs; times in {unit}"
        + (f"; estimates: {args.estimates}" if args.estimates else "")
    )
    print(report.render([s for _, s in runs], unit, title), end="")
    if args.json:
        document = {
            "trace": {
                "path": args.trace,
                "format": args.format,
                "jobs": len(trace.jobs),
                "dropped_zero_gpu": trace.dropped_zero_gpu,
            },
            "cluster": {
                "nodes": shape.nodes,
                "gpus_per_node": shape.gpus_per_node,
                "nodes_per_rack": shape.nodes_per_rack,
            },
            "options": {
                "locality": "off" if args.no_locality else (args.model_info or "default only"),
                "locality_default": args.locality_default,
                "cross_rack_speed": args.cross_rack_speed,
                "preempt_overhead_s": args.preempt_overhead,
                "suspend_overhead_s": args.suspend_overhead,
                "migrate_overhead_s": args.migrate_overhead,
                "resize_overhead_s": args.resize_overhead,
                "checkpoint_interval_s": args.checkpoint_interval,
                "half_life_s": args.half_life,
                "gpu_util_pct": [low, high],
                "share_slowdown": args.share_slowdown,
                "pack_slowdown": args.pack_slowdown,
                "elastic": args.elastic,
                "estimates": args.estimates,
                "queues": args.queues,
            },
            "time_unit": "s",
            "runs": [report.as_json(s) for _, s in runs],
        }
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    if args.plot:
        from schedd.sim.plots import write_plots

        for path in write_plots(runs, args.plot, unit):
            print(f"wrote {path}")

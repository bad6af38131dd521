"""schedctl: the command-line client.

`schedctl token create` talks to the database directly (it is how the first admin
token comes to be, on the schedd host); `schedctl sim` replays a trace offline (see
docs/simulator.md); every other command talks to the HTTP API with $GPUSCHED_URL and
$GPUSCHED_TOKEN, exactly as curl would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from schedd import cli_nodes, cli_queues
from schedd.sim import cli as sim_cli
from shared import logging
from shared.config import ConfigError, SchedConfig, load

DEFAULT_URL = "http://127.0.0.1:8080"


async def _create_token(config: SchedConfig, user: str, admin: bool) -> str:
    from schedd.store import db, embedded, tokens

    dsn = config.resolved_dsn()
    pg = None
    if dsn is None:
        pg = await asyncio.to_thread(embedded.start, config.data_dir)
        dsn = pg.dsn
    pool = await db.connect(dsn, size=2)
    try:
        return await tokens.create(pool, user, "admin" if admin else "user")
    finally:
        await pool.close()
        if pg is not None:
            await asyncio.to_thread(pg.stop)  # only if this command started it


def _http(method: str, path: str, body: bytes | None = None, stream: bool = False) -> Any:
    url = os.environ.get("GPUSCHED_URL", DEFAULT_URL).rstrip("/") + path
    token = os.environ.get("GPUSCHED_TOKEN")
    if not token:
        sys.exit("schedctl: set GPUSCHED_TOKEN (see `schedctl token create`)")
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        response = urllib.request.urlopen(request, timeout=None if stream else 30)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("detail", detail)
        sys.exit(f"schedctl: {exc.code}: {detail}")
    except urllib.error.URLError as exc:
        sys.exit(f"schedctl: cannot reach {url}: {exc.reason}")
    if stream:
        for chunk in iter(lambda: response.read1(65536), b""):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return None
    return json.loads(response.read())


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="schedctl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    token = sub.add_parser("token", help="API tokens").add_subparsers(dest="action", required=True)
    create = token.add_parser("create", help="create a token for USER and print it")
    create.add_argument("user")
    create.add_argument("--admin", action="store_true", help="the token may see every job")
    create.add_argument("--config", help="schedd.toml, for the database to use")

    submit = sub.add_parser("submit", help="submit a job spec (JSON file, or - for stdin)")
    submit.add_argument("spec")
    sub.add_parser("jobs", help="list jobs").add_argument("--state")
    sub.add_parser("job", help="show one job, with why it is pending").add_argument("job_id")
    sub.add_parser("cancel", help="cancel a job").add_argument("job_id")
    logs = sub.add_parser("logs", help="print a job's output")
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument(
        "--rank", type=int, default=0, help="a gang's part to read (default 0, on its head node)"
    )
    sub.add_parser("nodes", help="list nodes: GPUs free, jobs, faults, drains").add_argument(
        "--json", action="store_true", help="the API's answer, with every GPU"
    )
    clear = sub.add_parser(
        "clear-fault", help="put a GPU taken out of placement for a fault back (admin)"
    )
    clear.add_argument("node_id")
    clear.add_argument("gpu_uuid")
    drain = sub.add_parser(
        "drain", help="take a node out of placement: nothing new starts there (admin)"
    )
    drain.add_argument("node_id")
    drain.add_argument("--reason", required=True, help="why, shown in GET /v1/nodes")
    drain.add_argument(
        "--requeue", action="store_true", help="also preempt and requeue its jobs now"
    )
    sub.add_parser("undrain", help="put a drained node back into placement (admin)").add_argument(
        "node_id"
    )
    sub.add_parser("queues", help="queues: guarantee, max, use, borrowing, share, waits")
    sub.add_parser("explain", help="why a job is in its state, with its queue").add_argument(
        "job_id"
    )
    sim = sub.add_parser(
        "sim",
        help="replay a trace through policy profiles on simulated nodes",
        description="Replay a trace through policy profiles on a simulated cluster "
        "and report JCT, queueing, allocation, fairness and deadlines (docs/simulator.md).",
    )
    sim_cli.add_arguments(sim)

    args = parser.parse_args(argv)
    logging.configure("schedctl", "warning", logging.CurrentStderr())  # stdout: results
    if args.command == "token":
        try:
            config = load(SchedConfig, args.config)
        except ConfigError as exc:
            sys.exit(f"schedctl: config: {exc}")
        from schedd.store.embedded import EmbeddedPostgresError

        try:
            print(asyncio.run(_create_token(config, args.user, args.admin)))
        except EmbeddedPostgresError as exc:
            sys.exit(f"schedctl: {exc}")
    elif args.command == "submit":
        body = sys.stdin.buffer.read() if args.spec == "-" else Path(args.spec).read_bytes()
        _print(_http("POST", "/v1/jobs", body))
    elif args.command == "jobs":
        query = f"?state={args.state}" if args.state else ""
        for job in _http("GET", f"/v1/jobs{query}")["jobs"]:
            print(f"{job['id']}  {job['state']:<10}  {job['name']}")
    elif args.command == "job":
        _print(_http("GET", f"/v1/jobs/{args.job_id}"))
    elif args.command == "cancel":
        _print(_http("POST", f"/v1/jobs/{args.job_id}/cancel"))
    elif args.command == "logs":
        params = {"follow": 1} if args.follow else {}
        if args.rank:
            params["rank"] = args.rank
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        _http("GET", f"/v1/jobs/{args.job_id}/logs{query}", stream=True)
    elif args.command == "nodes":
        listed = _http("GET", "/v1/nodes")
        if args.json:
            _print(listed)
        else:
            print(cli_nodes.nodes_text(listed))
    elif args.command == "clear-fault":
        node, gpu = (urllib.parse.quote(x, safe="") for x in (args.node_id, args.gpu_uuid))
        path = f"/v1/nodes/{node}/gpus/{gpu}/fault"
        _print(_http("DELETE", path))
    elif args.command in ("drain", "undrain"):
        path = f"/v1/nodes/{urllib.parse.quote(args.node_id, safe='')}/drain"
        if args.command == "undrain":
            _print(_http("DELETE", path))
        else:
            body = {"reason": args.reason, "requeue": args.requeue}
            _print(_http("POST", path, json.dumps(body).encode()))
    elif args.command == "queues":
        print(cli_queues.queues_text(_http("GET", "/v1/queues")))
    elif args.command == "explain":
        job = _http("GET", f"/v1/jobs/{args.job_id}")
        print(cli_queues.explain_text(job, _http("GET", "/v1/queues")))
    elif args.command == "sim":
        sim_cli.run(args, sim)


if __name__ == "__main__":
    main()

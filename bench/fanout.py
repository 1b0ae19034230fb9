"""`turnkeep bench fanout`: one attempt's Gym phase over 16, 64 and 256 environment servers.

Each server is a real participant over real HTTP (its own aiohttp server and port, the
real participant routes and the environment server's participant over agents parked
at a turn boundary, as in `bench scaling`); some of them get an injected slow prepare.
The phase runs through the controller's own code (`controller.snapshot.env_server_phase`:
prepare until ready, commit, resume, all servers at once) and is compared with the
same servers driven one after the other, the sum a sequential coordinator would pay.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from aiohttp import web

from turnkeep.bench.parked_gym import ParkedGym
from turnkeep.bench.report import BenchResult, markdown_table
from turnkeep.controller.snapshot.env_server_phase import (
    commit_participants,
    prepare_participants,
    release_participants,
)
from turnkeep.envs.env_participant import env_capabilities
from turnkeep.participants.client import ParticipantClient
from turnkeep.participants.http_server import ControlAuth, add_participant_routes
from turnkeep.schemas.participant import FaultPlan

TOKEN = "bench-fanout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", default="16,64,256", help="comma-separated server counts")
    parser.add_argument("--agents", type=int, default=20, help="agents parked on each server")
    parser.add_argument("--slow-s", type=float, default=0.5, help="injected prepare delay of the slow servers")
    parser.add_argument("--repeats", type=int, default=5)


async def _nothing() -> None:
    pass


async def _start_server(stack: AsyncExitStack, index: int, agents: int, rng: random.Random) -> str:
    gym = ParkedGym()
    name = f"env{index}"
    gym.core.rename(env_capabilities(gym.core.capabilities.environments, name))
    await gym.park(agents, turns=2, rng=rng)
    stack.push_async_callback(gym.release)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    add_participant_routes(app, gym.core, ControlAuth(TOKEN), fault_injection=True)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _phase(clients: list[ParticipantClient], checkpoint_id: str, staging: Path) -> float:
    started = time.monotonic()
    await prepare_participants(clients, checkpoint_id, 30, _nothing)
    await commit_participants(clients, checkpoint_id, staging)
    await release_participants(clients, checkpoint_id, abort=False)
    return time.monotonic() - started


async def _measure(count: int, args, root: Path) -> dict:
    rng = random.Random(count)
    slow = max(1, count // 4)
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        urls = [await _start_server(stack, i, args.agents, rng) for i in range(count)]
        clients = [ParticipantClient(f"env{i}", url, TOKEN, session, timeout_s=60) for i, url in enumerate(urls)]
        for client in clients[:slow]:
            await client.set_faults(FaultPlan(delay_s={"prepare": args.slow_s}))
        together, one_by_one, slowest = [], [], []
        for repeat in range(args.repeats):
            together.append(await _phase(clients, f"fan-{count}-{repeat}", root / f"{count}-{repeat}"))
            alone = [await _phase([c], f"seq-{count}-{repeat}-{i}", root / f"{count}-{repeat}-seq")
                     for i, c in enumerate(clients)]
            one_by_one.append(sum(alone))
            slowest.append(max(alone))
    return {"servers": count, "slow_servers": slow, "agents_per_server": args.agents,
            "fan_out_s": statistics.median(together), "one_by_one_s": statistics.median(one_by_one),
            "slowest_alone_s": statistics.median(slowest),
            "fan_out_all_s": together, "one_by_one_all_s": one_by_one}


def run(args: argparse.Namespace) -> BenchResult:
    counts = [int(n) for n in args.servers.split(",")]
    with tempfile.TemporaryDirectory(prefix="turnkeep-fanout-") as tmp:
        rows = [asyncio.run(_measure(count, args, Path(tmp))) for count in counts]
    table = markdown_table(
        ["servers", f"slow (+{args.slow_s:.1f}s prepare)", "Gym phase, all at once (s)", "slowest server alone (s)",
         "one after the other (s)", "all at once / slowest alone"],
        [[r["servers"], r["slow_servers"], r["fan_out_s"], r["slowest_alone_s"], r["one_by_one_s"],
          r["fan_out_s"] / r["slowest_alone_s"]] for r in rows],
    )
    notes = [
        f"Medians of {args.repeats} repeats; each server has {args.agents} agents parked at a turn boundary and "
        "saves them on commit. The slow servers answer prepare after an injected delay.",
        "All at once follows the slowest server: the phase stays near the injected delay as servers are added, "
        "while one after the other grows with the number of slow servers.",
    ]
    return BenchResult("fanout", table, {"rows": rows, "slow_s": args.slow_s}, notes)

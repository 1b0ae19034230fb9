"""The live engines' URLs, told to every environment server (`PUT /engines`), whose agents route turns by them.

The run's own server and the stand-alone ones are told the same way, over HTTP with the run's token. A stand-alone
server that restarts is attached again with the list of that moment (its stored attach request is kept current).
A server that cannot be told now keeps its older list: its calls to a dead engine fail over by themselves, and
the next change tells it again.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from turnkeep.controller.processes import EnvServerEndpoint

log = logging.getLogger("turnkeep.engines")

PUSH_TIMEOUT_S = 10.0


async def push_routes(servers: list[EnvServerEndpoint], session: aiohttp.ClientSession, urls: list[str]) -> int:
    """Tell every server `urls`; the number that took it."""
    for server in servers:
        if server.attach is not None and urls:
            server.attach.policy_urls, server.attach.policy_url = list(urls), urls[0]
    if not urls:
        # Nothing to route to: servers keep their lists and fail over; an empty list would only make them wait.
        return 0
    told = await asyncio.gather(*(_tell(server, session, urls) for server in servers))
    return sum(told)


async def _tell(server: EnvServerEndpoint, session: aiohttp.ClientSession, urls: list[str]) -> bool:
    try:
        async with session.put(f"{server.url}/engines", json={"urls": urls},
                               headers={"Authorization": f"Bearer {server.token}"},
                               timeout=aiohttp.ClientTimeout(total=PUSH_TIMEOUT_S)) as resp:
            if resp.status == 200:
                return True
            log.warning("environment server %s refused the engines' routes: HTTP %d %s", server.name, resp.status,
                        (await resp.text())[:200])
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        log.info("environment server %s not told the engines' routes now (%s)", server.name, type(err).__name__)
    return False

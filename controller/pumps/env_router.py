"""Every environment server of the run behind one client: each call goes to the server
that runs the problem's environment.

A server that stops answering (killed, restarting, its machine gone) is marked away.
Its in-flight rollouts fail and are retried by the pump's usual rules, but a retry
first waits here until the server answers again, so an absence spends no attempts;
meanwhile a probe polls its `/health`, re-attaches a stand-alone server that came back
without the run (a fresh process), starts the run's own server again when it stays away
(`revive`), and one warning names a server that stays away longer than `absence_warn_s`. A snapshot attempt during an absence fails at once with
a reason naming the server (`away()`).

A server that hangs counts as away too: every call has a time limit (`EnvClient`), and a
call that runs out of it marks the server away with the call and the server's URL as
the reason. An ACK to a server that is away fails at once instead of waiting: a
snapshot's prepare waits for the ACKs in flight.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from turnkeep.controller.pumps.env_client import EnvClient, EnvServerError, EnvTimeout
from turnkeep.schemas.environments import AttachRequest, JudgeRequest
from turnkeep.schemas.rollout import RolloutRequest, RolloutResult

log = logging.getLogger("turnkeep.env")

PROBE_S = 0.5
REVIVE_AFTER_S = 2.0
"""A server of the run's own that does not answer this long is started again (and again this often)."""
REVIVE_TIMEOUT_S = 120.0


@dataclass
class EnvServerLink:
    client: EnvClient
    environments: list[str]
    """The run's environment names this server runs."""
    attach: AttachRequest | None = None
    """How to re-attach a stand-alone server that restarted (None: the run's own server, attached in-process)."""
    revive: Callable[[str], Awaitable[None]] | None = None
    """Starts the server again when it stays away (the run's own server; a stand-alone one is its operator's)."""
    revived_at: float | None = None
    away_since: float | None = None
    reason: str = ""
    back: asyncio.Event = field(default_factory=asyncio.Event)
    probe: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.back.set()

    @property
    def name(self) -> str:
        return self.client.name


class EnvRouter:
    def __init__(self, links: list[EnvServerLink], absence_warn_s: float = 30.0) -> None:
        self.links = links
        self._by_env = {env: link for link in links for env in link.environments}
        self._absence_warn_s = absence_warn_s
        self._receipts: dict[str, EnvServerLink] = {}
        self._running: dict[str, EnvServerLink] = {}

    def link_for(self, env_name: str) -> EnvServerLink:
        link = self._by_env.get(env_name)
        if link is None:
            raise EnvServerError(f"no environment server runs environment {env_name!r} "
                                 f"(configured: {sorted(self._by_env)})")
        return link

    def away(self) -> list[str]:
        """One line per server that is away now, naming it, since when and why."""
        now = time.monotonic()
        return [f"environment server {link.name} ({link.client.base_url}) away for {now - link.away_since:.1f}s: "
                f"{link.reason}" for link in self.links if link.away_since is not None]

    def is_away(self, env_name: str) -> bool:
        return self.link_for(env_name).away_since is not None

    async def wait_available(self, env_name: str) -> None:
        await self.link_for(env_name).back.wait()

    async def run(self, request: RolloutRequest) -> RolloutResult:
        link = self.link_for(request.problem.env)
        self._running[request.rollout_id] = link
        try:
            result = await self._guarded(link, link.client.run(request))
        finally:
            self._running.pop(request.rollout_id, None)
        if result.receipt:
            self._receipts[result.receipt] = link
        return result

    async def judge(self, request: JudgeRequest) -> list[float]:
        link = self.link_for(request.problem.env)
        return await self._guarded(link, link.client.judge(request))

    async def ack(self, receipt: str) -> None:
        link = self._receipts.get(receipt)
        if link is None:
            raise EnvServerError(f"receipt {receipt} was not issued by any server this run knows")
        if link.away_since is not None:
            # A snapshot's prepare waits for the ACKs in flight: fail now rather than wait for a server that is away.
            raise EnvServerError(f"cannot ACK {receipt}: environment server {link.name} ({link.client.base_url}) "
                                 f"is away: {link.reason}")
        await self._guarded(link, link.client.ack(receipt))
        self._receipts.pop(receipt, None)

    async def cancel(self, rollout_id: str) -> None:
        link = self._running.get(rollout_id)
        if link is not None and link.away_since is None:
            await self._guarded(link, link.client.cancel(rollout_id))

    async def cancel_all(self) -> int:
        """Every server's agents stopped at once (each call time-limited); servers that are away are skipped."""
        async def one(link: EnvServerLink) -> int:
            try:
                return await link.client.cancel_all()
            except (aiohttp.ClientError, EnvServerError) as err:
                log.warning("could not stop the agents of environment server %s (%s): %s", link.name,
                            link.client.base_url, err)
                return 0

        return sum(await asyncio.gather(*(one(link) for link in self.links if link.away_since is None)))

    async def health(self) -> dict:
        """The servers' counters added up (servers that are away, or go away now, are left out and named).

        All servers are asked at once, each call time-limited: a server that hangs costs one
        time limit, is marked away and left out.
        """
        total = {"turn_commits": 0, "running": 0, "unacked": 0}

        async def one(link: EnvServerLink) -> None:
            try:
                health = await link.client.health()
            except (aiohttp.ClientError, EnvServerError) as err:
                self._mark_away(link, f"/health failed: {err}")
                return
            for key in ("turn_commits", "running", "unacked"):
                total[key] += int(health.get(key, 0))

        asked = [link for link in self.links if link.away_since is None]
        await asyncio.gather(*(one(link) for link in asked))
        total["away"] = [link.name for link in self.links if link.away_since is not None]
        return total

    async def close(self) -> None:
        for link in self.links:
            if link.probe is not None:
                link.probe.cancel()

    # -- absence ------------------------------------------------------------------------

    async def _guarded(self, link: EnvServerLink, call):
        try:
            return await call
        except aiohttp.ClientConnectionError as err:
            self._mark_away(link, f"{type(err).__name__}: {err}")
            raise
        except EnvTimeout as err:  # a server that hangs is away as much as one that is gone
            self._mark_away(link, str(err))
            raise
        except EnvServerError as err:
            if "HTTP 503" in str(err):  # a restarted stand-alone server that no run has attached yet
                self._mark_away(link, str(err))
            raise

    def _mark_away(self, link: EnvServerLink, reason: str) -> None:
        if link.away_since is not None:
            return
        link.away_since, link.reason = time.monotonic(), reason
        link.back.clear()
        # Not a warning yet: a server that restarts is back within seconds; one away past absence_warn_s is warned of.
        log.info("environment server %s (%s) stopped answering: %s; its rollouts wait until it is back",
                 link.name, link.client.base_url, reason)
        link.probe = asyncio.get_running_loop().create_task(self._probe(link), name=f"probe-{link.name}")

    async def _probe(self, link: EnvServerLink) -> None:
        warned = False
        while True:
            await asyncio.sleep(PROBE_S)
            away_s = time.monotonic() - (link.away_since or time.monotonic())
            if not warned and away_s > self._absence_warn_s:
                warned = True
                message = (f"environment server {link.name} ({link.client.base_url}) has been away for "
                           f"{away_s:.0f}s ({link.reason}); restart it, the run waits for it")
                log.warning("%s", message)
                print(f"turnkeep: warning: {message}", file=sys.stderr, flush=True)
            if await self._answers(link):
                break
            if link.revive is not None and away_s > REVIVE_AFTER_S and (
                    link.revived_at is None or time.monotonic() - link.revived_at > REVIVE_AFTER_S):
                await self._revive(link)
        log.info("environment server %s is back after %.1fs", link.name, time.monotonic() - (link.away_since or 0))
        link.away_since, link.reason, link.probe = None, "", None
        link.back.set()

    async def _revive(self, link: EnvServerLink) -> None:
        try:
            await asyncio.wait_for(link.revive(link.reason), REVIVE_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - reported; the probe tries again
            link.reason = f"restarting it failed: {type(err).__name__}: {err}"[:300]
            log.warning("environment server %s: %s", link.name, link.reason)
        finally:
            link.revived_at = time.monotonic()

    async def _answers(self, link: EnvServerLink) -> bool:
        try:
            health = await link.client.health()
            if link.attach is not None:
                expected = f"{link.attach.run_id}:{link.attach.incarnation}"
                if health.get("attachment") != expected:
                    await link.client.attach(link.attach)
                    log.info("re-attached environment server %s", link.name)
            return True
        except (aiohttp.ClientError, EnvServerError, asyncio.TimeoutError) as err:
            link.reason = f"{type(err).__name__}: {err}"[:300]
            return False

"""What an environment's recovery level asks of its unfinished groups.

A group-scored environment's rewards need every sibling, so a live failure of one
sibling reruns the whole group, and a group is trained only after its judge scored all
siblings together. At the `prompt_group` level a live failure or a restore reruns the
whole group too. A rerun starts a new round: sibling tasks of the old round see it and
change nothing, their late rows are dropped, and the sealed rows it discards are counted
and written to the audit log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from turnkeep.controller.pumps.env_client import EnvClient, EnvServerError
from turnkeep.controller.rollout_levels import RolloutLevelPlan
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.schemas.audit import GroupDropped, GroupRerun
from turnkeep.schemas.environments import JudgeRequest

log = logging.getLogger("turnkeep.rollout")
JUDGE_TRIES = 3


class GroupReruns:
    def __init__(
        self, plans: dict[str, RolloutLevelPlan], ledger: GroupLedger, data_plane: DataPlane, env: EnvClient,
        stats: RunStats, max_rounds: int, cancel: Callable[[str], Awaitable[None]], audit: AuditLog | None = None,
    ) -> None:
        self._plans = plans
        self._ledger = ledger
        self._data_plane = data_plane
        self._env = env
        self._stats = stats
        self._max_rounds = max_rounds
        self._cancel = cancel
        self._audit = audit

    def plan(self, group_id: str) -> RolloutLevelPlan:
        return self._plans[self._ledger.problem(group_id).env]

    def count(self, group_id: str, key: str, n: int = 1) -> None:
        self._stats.recovery_by_env[self._ledger.problem(group_id).env][key] += n

    def rerun_at_restore(self, group_id: str) -> None:
        """Restore at the prompt_group level: the group starts over (nothing runs yet, so no barrier)."""
        discarded = self._ledger.restart_group(group_id)
        self._data_plane.delete([group_id])
        self._record(group_id, "prompt_group_restore", "restored at the prompt_group level", discarded)

    async def rerun_after_failure(self, group_id: str, reason: str, round_: int) -> bool | None:
        """Rerun the whole group after one sibling of round `round_` failed.

        False when the group used its rounds and was dropped; None when another failure of
        the same round got there first (this one has nothing left to do).
        """
        plan = self.plan(group_id)
        # Ledger and data plane change together under the barrier, so a cut never sees one without the other.
        async with self._data_plane.barrier:
            if self._ledger.round(group_id) != round_:
                return None
            running = self._ledger.running_rollouts(group_id)
            rerun = self._ledger.round(group_id) + 1 < self._max_rounds
            if rerun:
                discarded = self._ledger.restart_group(group_id)
                cause = "group_scored_failure" if plan.group_scored else "prompt_group_failure"
                self._record(group_id, cause, reason, discarded)
            else:
                # The train pump discards it as untrainable once the caller settles it.
                self._ledger.drop_group(group_id, reason)
                if self._audit is not None:
                    self._audit.emit(GroupDropped, group_id=group_id, reason=reason)  # its rows are deleted below
                log.warning("group %s dropped after %d whole-group rounds: %s", group_id, self._max_rounds, reason)
            self._data_plane.delete([group_id])
        for rollout_id in running:
            await self._cancel(rollout_id)
        return rerun

    async def score(self, group_id: str, round_: int) -> bool:
        """Ask the environment's judge for every sibling's reward; False when the group moved on meanwhile."""
        rows = self._data_plane.rows(group_id)
        request = JudgeRequest(
            group_id=group_id, problem=self._ledger.problem(group_id),
            policy_turns=[[seg.token_ids for seg in row.segments if seg.kind == "policy"] for row in rows],
        )
        for attempt in range(JUDGE_TRIES):
            try:
                rewards = await self._env.judge(request)
                break
            except (aiohttp.ClientError, EnvServerError) as err:
                log.warning("judge of group %s failed (try %d): %s", group_id, attempt + 1, err)
                last = err
                await asyncio.sleep(0.5 * 2**attempt)
        else:
            await self.rerun_after_failure(group_id, f"judge failed {JUDGE_TRIES} times: {last}", round_)
            return False
        async with self._data_plane.barrier:
            if self._ledger.round(group_id) != round_:
                return False
            self._data_plane.set_rewards(group_id, rewards)
            self._ledger.mark_scored(group_id)
        return True

    def _record(self, group_id: str, cause: str, reason: str, discarded: list[int]) -> None:
        round_ = self._ledger.round(group_id)
        key = "groups_retried_whole" if cause == "group_scored_failure" else "groups_rerun_whole"
        self.count(group_id, key)
        self.count(group_id, "sealed_discarded", len(discarded))
        log.info("group %s reruns whole (round %d, %s): %s; %d sealed siblings discarded",
                 group_id, round_, cause, reason, len(discarded))
        if self._audit is not None:
            self._audit.emit(GroupRerun, group_id=group_id, round=round_, cause=cause, reason=reason,
                             discarded_siblings=discarded)

"""A restore from the turn journal: the agents a restored controller still has running, held to continue.

The controller names each rollout (attempt N) its restored ledger has running, the
incarnation that started it, and the newest policy version the restored trainer knows.
This server finds each one's newest journaled boundary of that incarnation within that
version, holds it like a snapshot's saved agent, and says
where each stands, so the controller continues it as attempt N+1 from exactly there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from turnkeep.envs.restored_agents import RestoredAgents
from turnkeep.envs.turn_journal import TurnJournal, newest_boundaries
from turnkeep.primitives.audit_log import segments_digest
from turnkeep.schemas.participant import HeldBoundary, RunningAgent


async def hold_from_journal(journal: TurnJournal, restored: RestoredAgents, wanted: dict[str, RunningAgent],
                            token_level: Collection[str]) -> tuple[list[str], list[str], list[HeldBoundary]]:
    """(held rollout ids, restart_only ones that cannot continue, where each held one stands). An agent of an
    environment outside `token_level` (those at the `token` level) starts a turn a crash cut afresh."""
    end = await journal.sync()
    found = await asyncio.to_thread(newest_boundaries, journal.directory, journal.log_id, wanted, end)
    found = {rid: agent if agent.request.problem.env in token_level else agent.model_copy(update={"partial": None})
             for rid, agent in found.items()}
    held, cannot_continue = await restored.hold([(f"{journal.directory} ({rid})", agent)
                                                 for rid, agent in sorted(found.items())])
    stands = []
    for rollout_id in held:
        boundary, partial = found[rollout_id].boundary, found[rollout_id].partial
        stands.append(HeldBoundary(rollout_id=rollout_id, turn_index=boundary.turn_index,
                                   segments=len(boundary.segments), boundary_sha=segments_digest(boundary.segments),
                                   done=boundary.done, partial_tokens=len(partial.token_ids) if partial else 0))
    return held, cannot_continue, stands

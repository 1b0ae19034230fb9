"""How the run's snapshots keep the running agents: `snapshot.agents` resolved against what the
environment servers report at start.

`journal` stops nothing (a snapshot records each server's turn-journal position); it needs every
environment server to journal its turns. `parked` closes admission and parks every agent at its
next boundary; it works with any server. `auto` (the default) takes `journal` when it can and says
once, naming the servers, when it cannot.
"""

from __future__ import annotations

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.choices import AgentsMode
from turnkeep.schemas.participant import Capabilities


class AgentsModeError(ConfigError):
    """`snapshot.agents = "journal"` with a server that keeps no turn journal; the message names the fix."""


def resolve_agents_mode(
    configured: AgentsMode, journal_turns: bool, servers: list[Capabilities],
) -> tuple[AgentsMode, str | None]:
    """(the mode every attempt of this run uses, a warning to print once or None)."""
    without = sorted(caps.name for caps in servers if not caps.journals_turns)
    if configured == AgentsMode.PARKED:
        return AgentsMode.PARKED, None
    if configured == AgentsMode.JOURNAL:
        if without:
            raise AgentsModeError(
                f'snapshot.agents = "journal", but environment server(s) {without} keep no turn journal; start them '
                'with `turnkeep env-server --journal-dir DIR`, or set snapshot.agents = "auto" (parks when a server '
                'keeps no journal)')
        return AgentsMode.JOURNAL, None
    if not journal_turns:  # the run's own choice: no journal, so nothing to warn about
        return AgentsMode.PARKED, None
    if without:
        return AgentsMode.PARKED, (f"snapshots park the running agents (admission closes during each one): environment "
                          f"server(s) {without} keep no turn journal; start them with `--journal-dir DIR` "
                          f"(turnkeep env-server) so that snapshots stop nothing")
    return AgentsMode.JOURNAL, None

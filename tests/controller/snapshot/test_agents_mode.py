"""`snapshot.agents` resolved against the environment servers' reports."""

from __future__ import annotations

import pytest

from turnkeep.controller.snapshot.agents_mode import AgentsModeError, resolve_agents_mode
from turnkeep.envs.env_participant import env_capabilities
from turnkeep.schemas.config import TurnkeepConfig


def servers(**journals: bool):
    return [env_capabilities([], name, journals_turns=journals_turns) for name, journals_turns in journals.items()]


def test_auto_is_the_default_and_takes_the_journal_when_every_server_keeps_one() -> None:
    assert TurnkeepConfig().snapshot.agents == "auto"
    assert resolve_agents_mode("auto", True, servers(env=True, remote=True)) == ("journal", None)


def test_auto_parks_with_one_warning_naming_each_server_without_a_journal() -> None:
    mode, warning = resolve_agents_mode("auto", True, servers(env=True, remote_b=False, remote_a=False))
    assert mode == "parked"
    assert "environment server(s) ['remote_a', 'remote_b'] keep no turn journal" in warning
    assert "--journal-dir" in warning and "env'" not in warning


def test_auto_parks_quietly_when_the_run_turned_its_journal_off() -> None:
    assert resolve_agents_mode("auto", False, servers(env=False)) == ("parked", None)


def test_journal_refuses_a_server_without_a_journal_in_one_line_with_the_fix() -> None:
    with pytest.raises(AgentsModeError) as refused:
        resolve_agents_mode("journal", True, servers(env=True, remote=False))
    message = str(refused.value)
    assert "\n" not in message and "['remote']" in message and "--journal-dir" in message
    assert resolve_agents_mode("journal", True, servers(env=True)) == ("journal", None)


def test_parked_parks_whatever_the_servers_keep() -> None:
    assert resolve_agents_mode("parked", True, servers(env=True)) == ("parked", None)

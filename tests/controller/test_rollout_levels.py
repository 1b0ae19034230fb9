"""One target level, lowered per environment from its report; impossible settings refused up front."""

from __future__ import annotations

import pytest

from turnkeep.config.loader import parse_config
from turnkeep.controller.rollout_levels import (
    RolloutLevelError,
    check_rollout_levels,
    plan_levels,
    unjournaled_turns_warning,
)
from turnkeep.envs.agent_loop import for_environment
from turnkeep.envs.kinds import environment_capabilities
from turnkeep.schemas.participant import Capabilities

MIXED = {
    "calc": {"kind": "calc"}, "workspace": {"kind": "workspace"}, "lab": {"kind": "lab"}, "judge": {"kind": "judge"},
}


def _plans(raw: dict):
    cfg = parse_config(raw)
    return plan_levels(cfg, environment_capabilities(cfg.environments, cfg.rollout.group_size))


def test_each_environment_gets_the_finest_level_it_supports_with_one_warning_per_lowered_one():
    plans, warnings = _plans({"environments": MIXED})
    assert {name: plan.level for name, plan in plans.items()} == {
        "calc": "turn", "workspace": "turn", "lab": "sibling", "judge": "turn"}
    assert plans["judge"].group_scored and plans["judge"].retries_whole_group
    assert not plans["calc"].retries_whole_group
    [warning] = warnings
    assert "'lab'" in warning and "restart_only" in warning and "'turn' to 'sibling'" in warning


def test_the_token_level_is_for_environments_that_continue_turns_and_streams_their_turns():
    plans, warnings = _plans({"environments": MIXED, "rollout_recovery": {"target_level": "token"}})
    assert {name: plan.level for name, plan in plans.items()} == {
        "calc": "token", "workspace": "token", "lab": "sibling", "judge": "token"}
    assert plans["calc"].continues_saved_turns and plans["calc"].continues_partial_turns
    assert "'token' to 'sibling'" in warnings[0]
    # The server streams and journals the turns of each environment at the `token` level, and only those.
    cfg = parse_config({"environments": MIXED, "rollout_recovery": {"target_level": "token",
                                                                    "overrides": {"judge": "turn"}}})
    assert cfg.rollout_limits().partial_turn_environments == ["calc", "workspace", "lab"]
    calc, judge = (for_environment(cfg.rollout_limits(), name) for name in ("calc", "judge"))
    assert (calc.stream_turns, calc.journal_partial_turns, calc.partial_every_tokens) == (True, True, 32)
    assert (judge.stream_turns, judge.journal_partial_turns) == (False, False)
    assert parse_config({}).rollout_limits().partial_turn_environments == []


def test_a_coarser_target_is_not_lowered_further_and_overrides_only_coarsen():
    plans, warnings = _plans({"environments": MIXED, "rollout_recovery": {
        "target_level": "sibling", "overrides": {"judge": "prompt_group"}}})
    assert {name: plan.level for name, plan in plans.items()} == {
        "calc": "sibling", "workspace": "sibling", "lab": "sibling", "judge": "prompt_group"}
    assert warnings == []


@pytest.mark.parametrize("raw, named", [
    ({"rollout_recovery": {"overrides": {"jduge": "sibling"}}},
     ["rollout_recovery.overrides", "'jduge'", "[environments.jduge]"]),
    ({"environments": MIXED, "rollout_recovery": {"target_level": "sibling", "overrides": {"calc": "turn"}}},
     ["rollout_recovery.overrides.calc = 'turn'", "rollout_recovery.target_level = 'sibling'", "coarser"]),
    ({"snapshot": {"enabled": False}, "env": {"journal_turns": False}},
     ["rollout_recovery.target_level = 'turn'", "snapshot.enabled = false", "env.journal_turns = false",
      "env.journal_turns = true"]),
    ({"env": {"journal_turns": False}, "rollout_recovery": {"target_level": "token"}},
     ["rollout_recovery.target_level = 'token'", "env.journal_turns = false", "'turn'"]),
    ({"environments": {"judge": {"kind": "judge", "group_size": 4}}, "rollout": {"group_size": 8}},
     ["environments.judge.group_size = 4", "rollout.group_size = 8", "set both"]),
])
def test_settings_that_cannot_be_honoured_are_refused_naming_both_settings_and_the_fix(raw, named):
    with pytest.raises(RolloutLevelError) as refused:
        check_rollout_levels(parse_config(raw))
    for part in named:
        assert part in str(refused.value)


def test_snapshots_off_is_fine_once_no_environment_needs_saved_turns():
    check_rollout_levels(parse_config({"snapshot": {"enabled": False}, "env": {"journal_turns": False},
                                          "rollout_recovery": {"target_level": "sibling"}}))


def test_snapshots_off_keeps_the_turn_level_while_the_turn_journals_hold_the_turns():
    # A restore from a trainer checkpoint continues its running agents from the turn journals.
    check_rollout_levels(parse_config({"snapshot": {"enabled": False}}))


def test_a_server_that_does_not_report_a_configured_environment_is_refused():
    cfg = parse_config({"environments": MIXED})
    reported = [caps for caps in environment_capabilities(cfg.environments, 8) if caps.name != "lab"]
    with pytest.raises(RolloutLevelError, match="reports only"):
        plan_levels(cfg, reported)


def test_a_judge_reporting_another_group_size_is_refused():
    cfg = parse_config({"environments": {"judge": {"kind": "judge"}}})
    [caps] = environment_capabilities(cfg.environments, 8)
    with pytest.raises(RolloutLevelError, match="rollout.group_size = 8"):
        plan_levels(cfg, [caps.model_copy(update={"group_size": 6})])


def test_an_unknown_key_in_an_environment_names_the_allowed_ones():
    from turnkeep.config.loader import ConfigError

    with pytest.raises(ConfigError, match="unknown key 'environments.calc.kynd'.*entry, group_size, kind, options, token_file, url, weight"):
        parse_config({"environments": {"calc": {"kynd": "calc"}}})


def _servers(cfg, journaled: dict[str, bool]) -> list[Capabilities]:
    """One server per environment, named `<env>-server`, journaling its turns as `journaled` says."""
    return [Capabilities(name=f"{caps.name}-server", kind="environment", saves_state=True, environments=[caps],
                         journals_turns=journaled[caps.name])
            for caps in environment_capabilities(cfg.environments, cfg.rollout.group_size)]


def test_snapshots_off_warns_once_about_turn_level_servers_that_keep_no_journal():
    cfg = parse_config({"environments": MIXED, "snapshot": {"enabled": False}})
    plans, _ = plan_levels(cfg, environment_capabilities(cfg.environments, cfg.rollout.group_size))
    servers = _servers(cfg, {"calc": True, "workspace": False, "lab": False, "judge": False})
    warning = unjournaled_turns_warning(cfg, servers, plans)
    # lab is already 'sibling' (restart_only): nothing is lost there that the plan did not say.
    assert "judge-server (judge); workspace-server (workspace)" in warning and "lab" not in warning
    assert "--journal-dir DIR" in warning and "snapshot.enabled = true" in warning
    assert unjournaled_turns_warning(cfg, _servers(cfg, dict.fromkeys(MIXED, True)), plans) is None


def test_with_snapshots_on_a_server_without_a_journal_needs_no_warning():
    cfg = parse_config({"environments": MIXED})
    plans, _ = plan_levels(cfg, environment_capabilities(cfg.environments, cfg.rollout.group_size))
    assert unjournaled_turns_warning(cfg, _servers(cfg, dict.fromkeys(MIXED, False)), plans) is None


def test_a_replay_environment_keeps_the_token_level_and_one_declared_not_replayable_is_lowered_by_its_options():
    held = {"kind": "python", "entry": "tests.envs.replay_envs:HeldCalc", "options": {"hold_dir": "/nonexistent"}}
    guess = {"kind": "openenv", "options": {"url": "http://127.0.0.1:9", "replay": False}}
    plans, warnings = _plans({"environments": {"held": held, "guess": guess},
                              "rollout_recovery": {"target_level": "token"}})
    assert (plans["held"].level, plans["held"].recovery_mode) == ("token", "replay")
    assert (plans["guess"].level, plans["guess"].recovery_mode) == ("sibling", "restart_only")
    [warning] = warnings
    assert "'guess' (openenv, restart_only)" in warning

"""`[algorithm]`: settings that make no sense are refused at start with the reason; defaults fill from [train]."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from turnkeep.schemas.config import TurnkeepConfig


@pytest.mark.parametrize(("settings", "reason"), [
    ({"dual_clip": 0.5}, "greater than 1"),
    ({"entropy_coef": -0.01}, "greater than or equal to 0"),
    ({"clip_low": 1.2}, "less than 1"),
    ({"advantage": "gae"}, "'rloo', 'grpo' or 'reinforce_pp'"),
    ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip applies to policy_loss = \"ppo_clip\""),
    ({"advantage": "reinforce_pp", "scale_rewards": "group"}, "already normalises over the batch"),
    ({"reference_path": "/models/base"}, "reference_path is set but algorithm.kl_coef = 0"),
    ({"kl_coef": 0.1, "kl_estimator": "k4"}, "'k1', 'k2' or 'k3'"),
])
def test_a_bad_setting_is_refused_with_the_reason(settings: dict, reason: str) -> None:
    with pytest.raises(ValidationError) as refused:
        TurnkeepConfig.model_validate({"algorithm": settings})
    assert reason in str(refused.value)


def test_defaults_come_from_the_train_and_rollout_tables() -> None:
    cfg = TurnkeepConfig.model_validate({"train": {"clip_eps": 0.1}, "rollout": {"max_turns": 3,
                                                                                "max_tokens_per_turn": 20},
                                         "algorithm": {"clip_high": 0.28}})
    resolved = cfg.algorithm_settings()
    assert (resolved.clip_low, resolved.clip_high, resolved.loss_constant) == (0.1, 0.28, 60)


def test_an_overlong_buffer_as_long_as_a_row_can_be_is_refused_before_the_run_starts(tmp_path) -> None:
    from turnkeep.config.loader import ConfigError
    from turnkeep.workers.startup_checks import check_before_start

    cfg = TurnkeepConfig.model_validate({"run": {"run_dir": str(tmp_path / "run")}, "model": {"cache_dir": str(
        tmp_path / "models")}, "rollout": {"max_turns": 2, "max_tokens_per_turn": 8},
        "algorithm": {"overlong_buffer": 16}, "snapshot": {"enabled": False}})
    with pytest.raises(ConfigError) as refused:
        check_before_start(cfg)
    assert str(refused.value) == ("algorithm.overlong_buffer = 16 must be below the 16 tokens a row can generate "
                                  "(rollout.max_turns x rollout.max_tokens_per_turn); lower it")

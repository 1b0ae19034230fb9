"""`[eval]`: an evaluation with nothing to evaluate on is refused at start in one line; its slot share becomes a
bound on the evaluation rollouts in flight."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.config_eval import EvalConfig

TOOL_CHAT = {"math": {"kind": "tool_chat", "options": {"reasoning_gym": {"tasks": ["basic_arithmetic"]}}}}


def test_periodic_evaluation_needs_held_out_prompts() -> None:
    with pytest.raises(ValidationError) as refused:
        TurnkeepConfig.model_validate({"eval": {"every_steps": 5}})
    assert "[eval] has no held-out prompts: set eval.prompts" in str(refused.value)
    TurnkeepConfig.model_validate({"eval": {"every_steps": 5}, "environments": TOOL_CHAT})
    TurnkeepConfig.model_validate({"eval": {"every_steps": 5, "prompts": "held_out.jsonl"}})
    TurnkeepConfig.model_validate({})  # no [eval]: only an operator's request evaluates, and it says what is missing


def test_the_engine_share_bounds_evaluation_rollouts_in_flight() -> None:
    assert EvalConfig(engine_share=0.25).concurrency(engines=2, max_num_seqs=128) == 64
    assert EvalConfig(engine_share=0.01).concurrency(engines=1, max_num_seqs=8) == 1
    with pytest.raises(ValidationError):
        EvalConfig(engine_share=0)

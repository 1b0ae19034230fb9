"""A few real train steps: real vLLM CPU engine, real Ray, the environment server over HTTP."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import orjson
import pytest

from tests.stack_training import train_shared_stack
from turnkeep.controller.stores.trainer_checkpoint import published_steps

pytestmark = pytest.mark.integration


def test_real_steps_train_refit_checkpoint_and_report(stack, stack_config):
    # The session's trainer may have trained already (tests share it): continue from its version.
    start = asyncio.run(_actor(stack.trainer.version.remote()))
    run_dir = Path(tempfile.mkdtemp(prefix="tk-runtime-", dir="/tmp"))
    cfg = stack_config.model_copy(update={"run": stack_config.run.model_copy(update={"run_dir": run_dir})})
    controller = asyncio.run(train_shared_stack(cfg, stack, start, steps=3))
    steps = [start + 1, start + 2, start + 3]

    lines = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [line["step"] for line in lines] == steps
    for line in lines:
        for key in ("reward_mean", "rollout_tokens_per_s", "train_step_s", "groups_trained",
                    "policy_version", "staleness_max"):
            assert key in line, key
        assert line["groups_trained"] == stack_config.train.prompts_per_step
        assert 0 <= line["staleness_max"] <= stack_config.train.max_staleness
        assert line["trainer_tokens"] > 0
        # Every refit carried the whole model: its bytes and rate are measured.
        assert line["refit_bytes"] > 100_000 and line["refit_gb_per_s"] > 0
        assert line["trainer_nonfinite_steps_skipped"] == 0
    assert [line["policy_version"] for line in lines] == steps
    # A step can land with no new rows since the previous one; over the run, generation happened.
    assert sum(line["rollout_tokens_per_s"] for line in lines) > 0

    # The refit reached the policy server: it now serves the last step's version.
    health = asyncio.run(_actor(stack.policy.health.remote()))
    assert health["policy_version"] == steps[-1]

    # save_period = 2: even steps were checkpointed atomically, with the controller's state, and so was the last step.
    saved = sorted({s for s in steps if s % 2 == 0} | {steps[-1]})
    assert published_steps(run_dir) == saved
    ckpt = run_dir / "checkpoints" / f"step_{saved[0]}"
    assert {p.relative_to(ckpt).as_posix() for p in (ckpt / "trainer").rglob("*")} >= {
        "trainer/shards/.metadata", "trainer/shards/__0_0.distcp", "trainer/rng/rank_0.pt"}
    state = orjson.loads((ckpt / "controller_state.json").read_bytes())
    assert state["step"] == saved[0]
    assert state["dataloader"]["next_index"] > 8
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".staging")]

    # Every stored row was ACKed: the environment server holds no finished result.
    assert controller.env_health["unacked"] == 0
    assert controller.ledger.inflight() <= stack_config.inflight_group_limit()


async def _actor(ref):
    return await ref

"""A restored agent rebuilt by replay (`envs/replay.py`): on a Qwen-style template, with a tool environment whose
replies are a pure function of the turns (and one whose replies change), the replay either matches every journaled
observation, or names the first turn that differs, a replay past its time limit, or an error; each is one audit line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.envs.chat_model import save_chat_tokenizer
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.replay import ReplayFailed, replay_to_boundary
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog, read_audit
from turnkeep.schemas.audit import ReplayChecked
from turnkeep.schemas.rollout import Problem, RolloutRequest, Segment, TurnBoundary


class Counter(Environment):
    """Replies `n=<turns so far>` (a pure function of the turns); `offset` shifts every reply (another process that
    would answer otherwise); `delay_s` slows every step; `broken` raises at the second step."""

    kind = "counter"
    recovery_mode = "replay"

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext(), offset: int = 0, delay_s: float = 0.0,
                 broken: bool = False) -> None:
        self.turns, self.offset, self.delay_s, self.broken = 0, offset, delay_s, broken

    def prompt(self) -> str:
        return "count"

    async def step(self, turn_text: str) -> StepResult:
        self.turns += 1
        if self.broken and self.turns == 2:
            raise RuntimeError("the tool's process is gone")
        await asyncio.sleep(self.delay_s)
        return StepResult(observation=f"n={self.turns + (self.offset if self.turns >= 2 else 0)}", done=False)

    def reward(self) -> float:
        return 0.0


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> TurnCodec:
    out = tmp_path_factory.mktemp("qwen_style")
    save_chat_tokenizer(out)
    return TurnCodec(out)


def _boundary(codec: TurnCodec, turns: int) -> TurnBoundary:
    """The journaled boundary of a Counter episode after `turns` turns."""
    segments = [Segment(kind="prompt", token_ids=codec.conversation_start("count"))]
    for turn in range(1, turns + 1):
        ids = codec.encode(f"next {turn}") + list(codec.end_of_turn_ids)
        segments += [Segment(kind="policy", token_ids=ids),
                     Segment(kind="tool", token_ids=codec.after_turn(ids, f"n={turn}", "tool"))]
    return TurnBoundary(rollout_id="g1.0.0", turn_index=turns, segments=segments)


REQUEST = RolloutRequest(rollout_id="g1.0.1", group_id="g1", sibling=0, attempt=1,
                         problem=Problem(question="count", env="counting"), resume_from="g1.0.0")


def _replay(codec: TurnCodec, env: Counter, audit: AuditLog | None, timeout_s: float = 5.0):
    return asyncio.run(replay_to_boundary(env, codec, _boundary(codec, 3), REQUEST, timeout_s, audit))


def _audit_lines(tmp_path: Path, codec: TurnCodec, env: Counter, timeout_s: float = 5.0) -> list[ReplayChecked]:
    async def go() -> None:
        audit = AuditLog(tmp_path / AUDIT_FILE, incarnation=0)
        audit.start()
        try:
            await replay_to_boundary(env, codec, _boundary(codec, 3), REQUEST, timeout_s, audit)
        except ReplayFailed:
            pass
        await audit.close()

    asyncio.run(go())
    return [e for e in read_audit(tmp_path) if isinstance(e, ReplayChecked)]


def test_a_replay_that_gives_back_every_journaled_observation_continues_and_is_timed(codec, tmp_path) -> None:
    outcome = _replay(codec, Counter(REQUEST.problem), None)
    assert outcome.turns == 3 and outcome.diverged_turn is None and outcome.seconds >= 0
    [line] = _audit_lines(tmp_path, codec, Counter(REQUEST.problem))
    assert (line.rollout_id, line.resumed_from, line.env, line.turns, line.diverged_turn, line.reason) == (
        "g1.0.1", "g1.0.0", "counting", 3, None, "")


def test_a_different_observation_names_the_environment_the_rollout_and_the_first_differing_turn(codec,
                                                                                                 tmp_path) -> None:
    with pytest.raises(ReplayFailed, match=r"environment 'counting' \(counter\): rollout g1.0.0 cannot continue by "
                                           r"replay, turn 1's observation differs from the journaled one "
                                           r"\(journaled sha256 [0-9a-f]{12}, replayed [0-9a-f]{12}: 'n=3'\); its "
                                           r"sibling reruns from scratch"):
        _replay(codec, Counter(REQUEST.problem, offset=1), None)
    [line] = _audit_lines(tmp_path, codec, Counter(REQUEST.problem, offset=1))
    assert line.diverged_turn == 1 and "turn 1's observation differs" in line.reason


def test_a_replay_past_its_time_limit_or_one_that_raises_is_given_up_with_the_reason(codec, tmp_path) -> None:
    with pytest.raises(ReplayFailed, match=r"its 3 turns took longer than env.replay_timeout_s = 0.2 s"):
        _replay(codec, Counter(REQUEST.problem, delay_s=0.1), None, timeout_s=0.2)
    with pytest.raises(ReplayFailed, match=r"the replay raised RuntimeError: the tool's process is gone"):
        _replay(codec, Counter(REQUEST.problem, broken=True), None)
    [line] = _audit_lines(tmp_path, codec, Counter(REQUEST.problem, broken=True))
    assert line.diverged_turn is None and line.reason.startswith("the replay raised RuntimeError")

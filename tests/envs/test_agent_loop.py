"""The agent loop over chat templates: a calc rollout keeps the line protocol's exact ids, a Qwen-style
conversation equals the template's rendering of its messages, and a saved boundary continues token for
token; the last test runs it all on a real vLLM policy server with a locally made chat model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.envs.chat_model import ENDOFTEXT, IM_END, save_chat_model, save_chat_tokenizer
from tests.envs.test_codec import old_concatenation, save_tiny_dir, tiny_tokenizer
from turnkeep.envs.agent_loop import LoopLimits, run_agent
from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.tool_calls import ToolCallError, format_tool_result, parse_tool_calls
from turnkeep.envs.turn_journal import TurnJournal, newest_boundaries
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.gpu_workers.tiny_model.tokenizer import encode
from turnkeep.primitives.segment_log import SegmentLog
from turnkeep.primitives.segment_reader import oldest_position, read_records_to_end
from turnkeep.schemas.participant import RunningAgent
from turnkeep.schemas.policy import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from turnkeep.schemas.rollout import Problem, RolloutOutcome, RolloutRequest, RolloutResult, TurnBoundary

TURNS = 4
NO_CALL = "error: no tool call found; call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>"


class ToolTurnsEnvironment(Environment):
    """Answers every turn with a tool observation (the calls' results, or an error text) and ends after
    `TURNS` turns; every third observation comes back as a user message."""

    kind = "tool_turns"
    recovery_mode = "stateless"

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        self._problem = problem
        self.turns: list[str] = []
        self.replies: list[StepResult] = []
        self.calls = 0

    def prompt(self) -> str:
        return self._problem.question

    async def step(self, turn_text: str) -> StepResult:
        self.turns.append(turn_text)
        try:
            calls, _ = parse_tool_calls(turn_text)
            observation = format_tool_result([{"name": c.name, "result": "ok"} for c in calls]) if calls else NO_CALL
            self.calls += len(calls)
        except ToolCallError as err:
            observation = f"error: {err}"
        role = "user" if len(self.turns) % 3 == 0 else "tool"
        self.replies.append(StepResult(observation, done=len(self.turns) >= TURNS, role=role))
        return self.replies[-1]

    def reward(self) -> float:
        return self.calls / TURNS


class ScriptedPolicy:
    """A policy that answers with given token ids (vLLM's way: the stop token included)."""

    def __init__(self, turns: list[list[int]]) -> None:
        self._turns = list(turns)
        self.requests: list[CompletionRequest] = []
        self.rollout_ids: list[str | None] = []

    async def complete(self, request: CompletionRequest, *, rollout_id: str | None = None) -> CompletionResponse:
        self.requests.append(request)
        self.rollout_ids.append(rollout_id)
        ids = self._turns.pop(0)[: request.max_tokens]
        choice = CompletionChoice(text="", token_ids=ids, logprobs=CompletionLogprobs(token_logprobs=[-1.0] * len(ids)),
                                  finish_reason="stop")
        return CompletionResponse(id="x", choices=[choice], policy_version=3)


class RecordingRecords(TurnRecords):
    """Turn records that keep every committed boundary."""

    def __init__(self) -> None:
        super().__init__()
        self.all: list[TurnBoundary] = []

    def commit(self, record: TurnBoundary, **journal) -> None:
        super().commit(record, **journal)
        self.all.append(record)


async def _no_park() -> None:
    return None


def request(env: str, question: str, attempt: int = 0) -> RolloutRequest:
    return RolloutRequest(rollout_id=f"g.0.{attempt}", group_id="g", sibling=0, attempt=attempt,
                          problem=Problem(question=question, answer=73, env=env))


def ids_of(result: RolloutResult) -> list[int]:
    assert result.row is not None, result.reason
    return [tok for seg in result.row.segments for tok in seg.token_ids]


def run(req: RolloutRequest, env: Environment, codec: TurnCodec, policy, limits: LoopLimits,
        records: TurnRecords | None = None, start: TurnBoundary | None = None) -> RolloutResult:
    records = records if records is not None else TurnRecords()
    return asyncio.run(run_agent(req, env, codec, policy, records, _no_park, limits, start=start))


LIMITS = LoopLimits(max_turns=6, max_tokens_per_turn=16, max_model_len=512, temperature=1.0)


def test_a_calc_rollout_keeps_the_line_protocols_ids(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    codec = TurnCodec(save_tiny_dir(tmp_path, tok))
    lines = ["C 37+48\n", "C 85-12\n", "A 73\n"]
    policy = ScriptedPolicy([encode(tok, line) for line in lines])
    env = CalcEnvironment(request("calc", "Q 37+48-12").problem)
    result = run(request("calc", "Q 37+48-12"), env, codec, policy, LIMITS)
    assert result.outcome is RolloutOutcome.FINISHED and result.row.reward == 1.0 and not result.row.truncated
    # Identical to what the loop built before templates: bos + the prompt line, each turn, each reply line.
    assert ids_of(result) == old_concatenation(tok, "Q 37+48-12", [encode(tok, line) for line in lines],
                                               ["R 85\n", "R 73\n", None])
    assert [s.kind for s in result.row.segments] == ["prompt", "policy", "tool", "policy", "tool", "policy"]
    assert env.turns == ["C 37+48", "C 85-12", "A 73"]  # without the end-of-turn newline
    assert all(r.stop_token_ids == codec.stop_ids for r in policy.requests)
    assert tok.token_to_id("\n") in codec.stop_ids
    assert policy.rollout_ids == ["g.0.0"] * 3  # a router keeps the rollout on its engine


def test_a_rollout_out_of_turns_is_a_truncated_row(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    codec = TurnCodec(save_tiny_dir(tmp_path, tok))
    policy = ScriptedPolicy([encode(tok, "C 1+1\n")] * 2)
    limits = LoopLimits(max_turns=2, max_tokens_per_turn=16, max_model_len=512, temperature=1.0)
    result = run(request("calc", "Q 1+1"), CalcEnvironment(request("calc", "Q 1+1").problem), codec, policy, limits)
    assert result.outcome is RolloutOutcome.TRUNCATED and result.row.truncated and result.row.num_turns == 2


def test_a_chat_rollout_is_the_templates_rendering_and_continues_token_for_token(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    save_chat_tokenizer(tmp_path)
    codec, hf = TurnCodec(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    texts = ['<tool_call>\n{"name": "add", "arguments": {"a": 37, "b": 48}}\n</tool_call>',
             '<tool_call>\n{"name": "add", "arguments": {"a": 37,, }\n</tool_call>',
             "I am thinking about this for a long time and",  # cut by max_tokens: closed by the loop
             "The answer is 85."]
    script = [codec.encode(t) + codec.encode(IM_END) for t in texts]
    limits = LoopLimits(max_turns=6, max_tokens_per_turn=max(map(len, script)), max_model_len=1024, temperature=1.0)
    script[2] = codec.encode(texts[2] * 20)[: limits.max_tokens_per_turn]  # max_tokens hit before the end of the turn
    records = RecordingRecords()
    env = ToolTurnsEnvironment(request("tool_turns", "What is 37 plus 48?").problem)
    result = run(request("tool_turns", "What is 37 plus 48?"), env, codec, ScriptedPolicy(script), limits, records)
    assert result.outcome is RolloutOutcome.FINISHED and result.row.num_turns == TURNS
    assert env.turns[0] == texts[0] and env.turns[3] == texts[3] and env.turns[1] == texts[1]
    assert env.replies[0].observation == '[{"name": "add", "result": "ok"}]'
    assert env.replies[1].observation.startswith("error: tool call 1: not valid JSON")
    assert [r.role for r in env.replies] == ["tool", "tool", "user", "tool"]

    messages = [{"role": "user", "content": "What is 37 plus 48?"}]
    for turn, reply in zip(env.turns, env.replies, strict=True):
        messages += [{"role": "assistant", "content": turn}, {"role": reply.role, "content": reply.observation}]
    whole = hf.apply_chat_template(messages, tokenize=False)  # the last reply ends the episode: no prompt after
    assert codec.decode(ids_of(result)) == whole
    assert ids_of(result) == hf(whole, add_special_tokens=False)["input_ids"]
    # The closing <|im_end|> of the cut turn is glue (not trained on), not part of the policy's turn.
    cut_glue = result.row.segments[6]
    assert cut_glue.kind == "tool" and cut_glue.token_ids[:1] == codec.encode(IM_END)
    assert result.row.segments[5].token_ids == script[2]

    # Continue from the boundary after turn 2 on a fresh environment (replayed), then with the same script.
    saved = records.all[1]
    fresh = ToolTurnsEnvironment(request("tool_turns", "What is 37 plus 48?").problem)
    replayed = asyncio.run(fresh.replay([codec.turn_text(t) for t, _ in codec.turns_with_glue(saved.segments)]))
    assert codec.first_replay_difference(saved.segments, replayed) is None
    assert codec.first_replay_difference(saved.segments, list(reversed(replayed))) is not None
    again = request("tool_turns", "What is 37 plus 48?", attempt=1)
    continued = run(again, fresh, codec, ScriptedPolicy(script[2:]), limits,
                    start=saved.model_copy(update={"rollout_id": again.rollout_id}))
    assert continued.row.segments[: len(saved.segments)] == saved.segments
    assert continued.row.segments == result.row.segments and continued.row.num_turns == TURNS


# -- a real chat model on the real policy server --------------------------------------


@pytest.mark.integration
def test_episodes_of_a_chat_model_on_vllm_follow_its_template_and_restore_exactly(tmp_path: Path) -> None:
    """A random Llama with the Qwen-style template, served by vLLM (CPU): sampled episodes of several
    turns render as the template renders their messages; a greedy episode continued from a saved boundary
    extends the saved ids exactly and regenerates the same turns."""
    import aiohttp
    from transformers import AutoTokenizer

    from turnkeep.envs.policy_client import PolicyClient
    from turnkeep.gpu_workers.policy_server import PolicyServer
    from turnkeep.schemas.config_services import PolicyServerConfig

    model_dir = save_chat_model(tmp_path / "model")
    codec = TurnCodec(model_dir)
    hf = AutoTokenizer.from_pretrained(model_dir)
    sampled = LoopLimits(max_turns=TURNS + 2, max_tokens_per_turn=12, max_model_len=512, temperature=1.0)
    greedy = LoopLimits(max_turns=TURNS + 2, max_tokens_per_turn=12, max_model_len=512, temperature=0.0)
    question = "What is 37 plus 48? Use the add tool."

    async def episode(policy, limits, attempt, env=None, records=None, start=None):
        req = request("tool_turns", question, attempt)
        env = env or ToolTurnsEnvironment(req.problem)
        records = records if records is not None else TurnRecords()
        result = await run_agent(req, env, codec, policy, records, _no_park, limits, start=start)
        return env, result

    async def scenario() -> None:
        server = PolicyServer()
        cfg = PolicyServerConfig(kv_cache_memory_bytes=16 * 1024 * 1024, max_model_len=512, max_num_seqs=8)
        url = await server.start(model_dir, cfg)
        try:
            async with aiohttp.ClientSession() as session:
                policy = PolicyClient(url, session)
                done = await asyncio.gather(*(episode(policy, sampled, i) for i in range(6)))
                check_sampled(done)
                records = RecordingRecords()
                env, original = await episode(policy, greedy, 10, records=records)
                saved = records.all[1]  # after turn 2
                fresh = ToolTurnsEnvironment(request("tool_turns", question).problem)
                turns = [codec.turn_text(ids) for ids, _ in codec.turns_with_glue(saved.segments)]
                assert codec.first_replay_difference(saved.segments, await fresh.replay(turns)) is None
                again = request("tool_turns", question, 11)
                _, continued = await episode(policy, greedy, 11, env=fresh,
                                             start=saved.model_copy(update={"rollout_id": again.rollout_id}))
                assert continued.row.segments[: len(saved.segments)] == saved.segments
                assert continued.row.num_turns == TURNS
                # Greedy: the continuation regenerates the original's later turns, token for token.
                assert [(s.kind, s.token_ids) for s in continued.row.segments] == \
                    [(s.kind, s.token_ids) for s in original.row.segments]
                await check_cut_turns_continue_exactly(policy, codec, question, original, tmp_path / "journal")
        finally:
            await server.stop()

    def check_sampled(done: list[tuple[ToolTurnsEnvironment, RolloutResult]]) -> None:
        closed = cut = rendered = 0
        for env, result in done:
            assert result.outcome is RolloutOutcome.FINISHED, result.reason
            row = result.row
            assert row.num_turns == TURNS and [s.kind for s in row.segments] == ["prompt"] + ["policy", "tool"] * TURNS
            prompt = hf.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                            add_generation_prompt=True)
            assert row.segments[0].token_ids == hf(prompt, add_special_tokens=False)["input_ids"]
            policy_ids = [s.token_ids for s in row.segments if s.kind == "policy"]
            assert env.turns == [codec.turn_text(ids) for ids in policy_ids]
            assert not any(t.endswith(IM_END) for t in env.turns)
            for ids in policy_ids:
                closed += codec.turn_closed(ids)
                cut += not codec.turn_closed(ids)
                assert codec.turn_closed(ids) or len(ids) == sampled.max_tokens_per_turn
            for seg in row.segments[1:]:  # glue is the canonical tokenisation of its text
                if seg.kind == "tool":
                    assert seg.token_ids == hf(codec.decode(seg.token_ids), add_special_tokens=False)["input_ids"]
            if any(ids[-1] == codec.encode(ENDOFTEXT)[0] for ids in policy_ids):
                continue  # a turn ended on <|endoftext|>: kept as generated, so no template renders it
            messages = [{"role": "user", "content": question}]
            for turn, reply in zip(env.turns, env.replies, strict=True):
                messages += [{"role": "assistant", "content": turn}, {"role": reply.role, "content": reply.observation}]
            assert codec.decode(ids_of(result)) == hf.apply_chat_template(messages, tokenize=False)
            rendered += 1
        assert closed and cut and rendered, (closed, cut, rendered)

    asyncio.run(scenario())


async def check_cut_turns_continue_exactly(policy, codec: TurnCodec, question: str, original: RolloutResult,
                                           directory: Path) -> None:
    """The token level on the real engine, one request at a time: the greedy episode streamed with its tokens
    journaled every 3 is the same episode; cut after any journaled chunk (the journal as a kill there leaves it)
    and continued from the restored turn and its tokens, it is still the same episode, token for token."""
    limits = LoopLimits(max_turns=TURNS + 2, max_tokens_per_turn=12, max_model_len=512, temperature=0.0,
                        stream_turns=True, journal_partial_turns=True, partial_every_tokens=3, partial_every_s=3600)
    records = TurnRecords(TurnJournal(directory, "env/test"))
    req = request("tool_turns", question, 20)
    streamed = await run_agent(req, ToolTurnsEnvironment(req.problem), codec, policy, records, _no_park, limits)
    assert [(s.kind, s.token_ids) for s in streamed.row.segments] == \
        [(s.kind, s.token_ids) for s in original.row.segments]
    await records.journal.sync()
    records.journal.close()
    payloads = list(read_records_to_end(directory, "env/test", oldest_position(directory, "env/test")))
    chunks = [i for i, payload in enumerate(payloads) if "partial_from" in orjson.loads(payload)]
    assert len(chunks) >= TURNS, "every turn of 12 tokens or fewer journals at least one chunk of 3"
    for cut, index in enumerate(chunks):  # after every chunk, the first turn's included
        kept = directory.parent / f"cut-{cut}"
        log = SegmentLog(kept, "env/test")
        for payload in payloads[: index + 1]:
            log.append(payload)
        end = await log.sync()
        log.close()
        wanted = {req.rollout_id: RunningAgent(max_version=0, incarnation=0)}
        saved = newest_boundaries(kept, "env/test", wanted, end)[req.rollout_id]
        assert saved.partial is not None and saved.partial.token_ids
        fresh = ToolTurnsEnvironment(req.problem)
        await fresh.replay([codec.turn_text(ids) for ids, _ in codec.turns_with_glue(saved.boundary.segments)])
        again = request("tool_turns", question, 21 + cut)
        start = saved.boundary.model_copy(update={"rollout_id": again.rollout_id})
        continued = await run_agent(again, fresh, codec, policy, TurnRecords(), _no_park, limits, start=start,
                                    partial=saved.partial)
        cut_turn = continued.row.segments[len(saved.boundary.segments)]
        assert cut_turn.token_ids[: len(saved.partial.token_ids)] == saved.partial.token_ids
        assert [(s.kind, s.token_ids) for s in continued.row.segments] == \
            [(s.kind, s.token_ids) for s in original.row.segments], f"cut after journal record {index}"

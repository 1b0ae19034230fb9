"""The evaluation pump against a stand-in for the environment servers: it plays each prompt's samples at most
`engine_share`'s slots at once, journals every scored sample, writes one line per evaluation, and after a crash
plays only the samples still to play, never writing a result twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from turnkeep.controller.pumps.eval_pump import EvalPump
from turnkeep.controller.state.eval_journal import EvalJournal
from turnkeep.primitives.holds import HoldSet
from turnkeep.primitives.pass_at_k import pass_at_k
from turnkeep.schemas.config_eval import EvalConfig
from turnkeep.schemas.rollout import Problem, RolloutOutcome, RolloutRequest, RolloutResult, RolloutRow, Segment


class Servers:
    """Answers each evaluation rollout with reward 1 for the samples `correct` names, else 0; `failing` samples fail
    every try; counts what it played and how many ran at once."""

    def __init__(self, correct: set[tuple[int, int]] = frozenset(), failing: set[tuple[int, int]] = frozenset(),
                 version: int = 3) -> None:
        self.correct, self.failing, self.version = correct, failing, version
        self.played: list[str] = []
        self.running = self.most_at_once = 0

    async def wait_available(self, env_name: str) -> None:
        return None

    async def run(self, request: RolloutRequest) -> RolloutResult:
        assert request.evaluation_temperature == 0.7
        self.played.append(request.rollout_id)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await asyncio.sleep(0.001)
        finally:
            self.running -= 1
        _, prompt, sample, _ = request.rollout_id.split(".")
        assert request.rollout_id.startswith(("eval-", ))
        key = (int(prompt), int(sample))
        if key in self.failing:
            return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED, reason="tool broke")
        row = RolloutRow(group_id=request.group_id, sibling=request.sibling, attempt=request.attempt, num_turns=1,
                         reward=1.0 if key in self.correct else 0.0,
                         segments=[Segment(kind="policy", token_ids=[1], logprobs=[-0.1],
                                           policy_version=self.version)])
        return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FINISHED, row=row)

    async def cancel(self, rollout_id: str) -> None:
        return None


def _pump(run_dir: Path, servers: Servers, lines: list[dict], prompts: int = 3, **settings) -> EvalPump:
    cfg = EvalConfig(samples=4, temperature=0.7, **settings)
    problems = [Problem(question=f"q{i}", answer=i, env="math") for i in range(prompts)]
    return EvalPump(cfg, problems, servers, EvalJournal(run_dir), HoldSet("admission"), concurrency=2,
                    rollout_timeout_s=5, write_line=lambda line: _write(run_dir, lines, line), run_dir=run_dir)


def _write(run_dir: Path, lines: list[dict], line: dict) -> None:
    lines.append(line)
    with (run_dir / "metrics.jsonl").open("ab") as f:
        f.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


async def _evaluate(pump: EvalPump, *steps: int, trigger: str = "every_steps") -> None:
    task = asyncio.create_task(pump.run())
    for step in steps:
        pump.request(step, trigger)
    await asyncio.sleep(0)
    await asyncio.wait_for(pump.finish(), 10)
    task.cancel()


def test_an_evaluation_scores_every_sample_once_and_writes_one_line(tmp_path) -> None:
    servers, lines = Servers(correct={(0, 0), (0, 1), (1, 3)}, failing={(2, 2)}), []
    pump = _pump(tmp_path, servers, lines)
    asyncio.run(_evaluate(pump, 4))
    line = lines[0]
    assert (line["kind"], line["step"], line["prompts"], line["samples"]) == ("eval", 4, 3, 4)
    assert line["pass@1"] == pytest.approx(3 / 12, abs=1e-4)
    assert line["pass@2"] == pytest.approx(pass_at_k([2, 1, 0], 4, 2), abs=1e-4)
    assert line["pass@4"] == pytest.approx(2 / 3, abs=1e-4)
    assert line["samples_failed"] == 1 and line["samples_resumed"] == 0
    assert (line["policy_version_min"], line["policy_version_max"]) == (3, 3)
    # A failing sample is tried eval.max_attempts times; every other one once; at most `concurrency` at a time.
    assert len(servers.played) == 11 + 3 and servers.most_at_once <= 2
    journal = [orjson.loads(raw) for raw in (tmp_path / "eval" / "evaluations.jsonl").read_bytes().splitlines()]
    assert [j["kind"] for j in journal] == ["asked"] + ["scored"] * 12 + ["done"]
    # The same step is not evaluated twice.
    assert pump.request(4, "every_steps") == "step 4 is evaluated already (every_steps)"
    # An operator's request at the same step is its own evaluation: the operator gets the line asked for.
    operator, lines[:] = [], []
    asyncio.run(_evaluate(_pump(tmp_path, servers, operator), 4, trigger="operator"))
    assert [(line["step"], line["trigger"]) for line in operator] == [(4, "operator")]


def test_after_a_crash_only_the_samples_left_are_played_and_the_line_is_written_once(tmp_path) -> None:
    servers, lines = Servers(correct={(p, s) for p in range(3) for s in range(4)}), []
    journal = EvalJournal(tmp_path)
    first = _pump(tmp_path, servers, lines)

    async def crash_after_five() -> None:
        task = asyncio.create_task(first.run())
        first.request(6, "every_steps")
        while (6, "every_steps") not in journal.read() or len(journal.read()[6, "every_steps"].scored) < 5:
            await asyncio.sleep(0.001)
        task.cancel()  # the process dies: what is journaled stays

    asyncio.run(crash_after_five())
    scored_before = journal.read()[6, "every_steps"].scored
    assert not lines and 5 <= len(scored_before) < 12
    servers.played.clear()
    second = _pump(tmp_path, servers, lines)
    assert second.unfinished() == [6]
    asyncio.run(_evaluate(second))
    [line] = lines
    assert line["step"] == 6 and line["pass@1"] == 1.0 and line["samples_resumed"] == len(scored_before)
    replayed = {tuple(map(int, rid.split(".")[1:3])) for rid in servers.played}
    assert replayed.isdisjoint(scored_before) and len(replayed) == 12 - len(scored_before)

    # A crash after the metrics line and before the journal's `done`: the next start writes no second line.
    journal_path = tmp_path / "eval" / "evaluations.jsonl"
    journal_path.write_bytes(b"".join(raw + b"\n" for raw in journal_path.read_bytes().splitlines()
                                      if b'"kind":"done"' not in raw))
    lines.clear()
    asyncio.run(_evaluate(_pump(tmp_path, servers, lines)))
    asyncio.run(_evaluate(_pump(tmp_path, servers, lines)))
    assert [line["step"] for line in lines] == []
    assert [line["step"] for line in map(orjson.loads, (tmp_path / "metrics.jsonl").read_bytes().splitlines())] == [6]
    # The same crash before the line was written: the next start writes it, once.
    (tmp_path / "metrics.jsonl").write_bytes(b"")
    journal_path.write_bytes(b"".join(raw + b"\n" for raw in journal_path.read_bytes().splitlines()
                                      if b'"kind":"done"' not in raw))
    asyncio.run(_evaluate(_pump(tmp_path, servers, lines)))
    asyncio.run(_evaluate(_pump(tmp_path, servers, lines)))
    assert [line["step"] for line in lines] == [6]


def test_a_waiting_periodic_evaluation_is_replaced_by_a_newer_one(tmp_path) -> None:
    servers, lines = Servers(), []
    pump = _pump(tmp_path, servers, lines, every_steps=2)

    async def scenario() -> None:
        task = asyncio.create_task(pump.run())
        pump.after_step(1)
        pump.after_step(2)
        while pump.running is None:
            await asyncio.sleep(0)
        for step in range(3, 9):
            pump.after_step(step)  # asks at 4, 6, 8 while 2 runs: 4 and 6 are replaced before they start
        await asyncio.wait_for(pump.finish(), 10)
        task.cancel()

    asyncio.run(scenario())
    assert [(line["step"], line["replaced_steps"]) for line in lines] == [(2, []), (8, [4, 6])]
    assert _pump(tmp_path, servers, []).unfinished() == []  # the replaced ones are not taken up after a restart


def test_a_run_without_held_out_prompts_says_so(tmp_path) -> None:
    pump = _pump(tmp_path, Servers(), [], prompts=0)
    assert pump.request(3, "operator").startswith("no held-out prompts: set eval.prompts")

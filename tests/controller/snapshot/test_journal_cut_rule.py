"""The consistent-cut rule of journal snapshots, with seals racing the cuts.

Agents commit turns to a real turn journal and seal their rows as the rollout pump does
(the row stored under the barrier, the sibling sealed after its ACK) while journal
snapshots are cut at random moments and a train step raises the policy version halfway.
Then every cut is restored the way `CrashRestore` does it (replay the controller journal
into a ledger and data plane, seal the siblings whose rows are in, ask the turn journal
for each running sibling's newest boundary) and checked against what the agents really
did, as this test recorded it:

- every row sealed before the cut is in it, exactly once, and no other;
- a sibling whose row is in the cut is never continued;
- a sibling sealed after the cut continues from its done boundary: its whole row, token
  for token, only to be scored again;
- one still mid-rollout continues from its newest committed boundary whose turns all come
  from the cut's policy version or older;
- groups admitted after the cut are not in it.
"""

from __future__ import annotations

import asyncio
import random

import orjson

from turnkeep.bench.filled_controller import STEP, FilledController
from turnkeep.controller.journal.replay import resolve_state, resolve_state_past_cut
from turnkeep.controller.snapshot.cut import STATE_FILE, cut_data_plane
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.sealing import seal_stored_rows
from turnkeep.envs.turn_journal import TurnJournal, newest_boundaries
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.schemas.participant import JournalMark, RunningAgent
from turnkeep.schemas.rollout import Problem, RolloutRequest, RolloutRow, Segment, TurnBoundary

GROUP_SIZE = 4
LOG_ID = "env/env"
INCARNATION = 1


class Agents:
    """Siblings that take turns and seal, recording what they did (the test's own account, not the product's)."""

    def __init__(self, controller: FilledController, records: TurnRecords, rng: random.Random) -> None:
        self.controller, self.records, self.rng = controller, records, rng
        self.sealed: list[tuple[str, int]] = []
        self.conversations: dict[tuple[str, int], list[Segment]] = {}
        self.rollout_ids: dict[tuple[str, int], str] = {}

    def admit(self, group_id: str) -> None:
        self.controller.ledger.admit(group_id, Problem(question="Q 1+1", answer=2), GROUP_SIZE)

    async def run(self, group_id: str, sibling: int, turns: int, finish: bool) -> None:
        ledger, key = self.controller.ledger, (group_id, sibling)
        attempt = ledger.start_attempt(group_id, sibling)
        rollout_id = self.rollout_ids[key] = f"{group_id}.{sibling}.{attempt}"
        request = RolloutRequest(rollout_id=rollout_id, group_id=group_id, sibling=sibling, attempt=attempt,
                                 incarnation=INCARNATION, problem=ledger.problem(group_id))
        segments = self.conversations[key] = [Segment(kind="prompt", token_ids=[self.rng.randrange(99)])]
        for turn in range(1, turns + 1):
            await asyncio.sleep(self.rng.uniform(0, 0.004))
            version = self.controller.training.policy_version
            segments.append(Segment(kind="policy", token_ids=[self.rng.randrange(99) for _ in range(3)],
                                    logprobs=[-0.1] * 3, policy_version=version))
            segments.append(Segment(kind="tool", token_ids=[self.rng.randrange(99)]))
            done = finish and turn == turns
            self.records.commit(TurnBoundary(rollout_id=rollout_id, turn_index=turn, segments=list(segments),
                                             done=done), request=request, env=None)
        if not finish:
            return
        await asyncio.sleep(self.rng.uniform(0, 0.004))  # the result travels to the controller
        row = RolloutRow(group_id=group_id, sibling=sibling, attempt=attempt, segments=list(segments), reward=1.0,
                         num_turns=turns)
        async with self.controller.data_plane.barrier:
            self.controller.data_plane.put(row)
            self.sealed.append(key)
        await asyncio.sleep(self.rng.uniform(0, 0.003))  # the ACK goes out; then the pump seals the sibling
        ledger.seal(group_id, sibling)


async def _scenario(tmp_path, seed: int):
    rng = random.Random(seed)
    controller = FilledController()
    controller.start_journal(tmp_path)
    turn_journal = TurnJournal(tmp_path / "env_journal", LOG_ID)
    records = TurnRecords(turn_journal)
    agents = Agents(controller, records, rng)
    cuts = []

    async def take_cuts() -> None:
        for number in range(12):
            await asyncio.sleep(rng.uniform(0.002, 0.01))
            staging = tmp_path / f"cut-{number}"
            staging.mkdir()
            position = await turn_journal.sync()
            mark = JournalMark(name="env", checkpoint_id=f"run.snapshot.1.{number + 1}", log_id=LOG_ID,
                               seq=position.seq, chain=position.chain)
            seen = {}

            async def at_the_cut() -> None:
                seen.update(sealed=list(agents.sealed), admitted=set(controller.ledger.group_ids()))

            cut = await cut_data_plane(controller, staging, STEP, None, at_the_cut, marks=[mark])
            cuts.append((staging, cut, seen, controller.training.policy_version))

    async def train_step_halfway() -> None:
        await asyncio.sleep(0.03)
        controller.training.policy_version += 1  # newer turns from here on; the step itself stays (no hold here)

    async def admit_and_run() -> None:
        tasks = []
        for index in range(10):
            group_id = f"g{index:07d}"
            agents.admit(group_id)
            for sibling in range(GROUP_SIZE):
                finish = rng.random() < 0.8
                tasks.append(asyncio.ensure_future(agents.run(group_id, sibling, rng.randint(1, 4), finish)))
            await asyncio.sleep(rng.uniform(0.001, 0.008))
        await asyncio.gather(*tasks)

    await asyncio.gather(take_cuts(), train_step_halfway(), admit_and_run())
    end = await turn_journal.sync()
    await controller.journal.sync()
    turn_journal.close()
    return controller, agents, cuts, end


def _running_after_restore(state: dict) -> dict[tuple[str, int], str]:
    """(group, sibling) -> rollout id of each sibling a restore of `state` would continue, as `CrashRestore` finds
    them: the state loaded, the siblings whose rows are in sealed."""
    data_plane, ledger = DataPlane(), GroupLedger()
    data_plane.load_state_dict(state["data_plane"])
    ledger.load_state_dict(state["group_ledger"])
    seal_stored_rows(data_plane, ledger)
    return {(gid, int(rid.rsplit(".", 2)[1])): rid for gid in ledger.group_ids() for rid in ledger.running_rollouts(gid)}


def _check_cut(tmp_path, agents: Agents, staging, cut, seen: dict, version: int, end) -> tuple[int, int]:
    raw = orjson.loads((staging / STATE_FILE).read_bytes())
    assert raw["agents_from"] == "journal" and raw["turn_journals"][0]["log_id"] == LOG_ID
    state = resolve_state(tmp_path, raw)
    rows = [(r["group_id"], r["sibling"]) for r in state["data_plane"]["rows"]]
    assert len(rows) == len(set(rows))
    assert set(rows) == set(seen["sealed"]), "the cut lost or invented a sealed row"
    assert {g["group_id"] for g in state["group_ledger"]["groups"]} == seen["admitted"]
    running = _running_after_restore(state)
    assert not set(running) & set(rows), "a sibling with its row in the cut would be continued"
    assert cut.running_agents == len(running)
    wanted = {rid: RunningAgent(max_version=version, incarnation=INCARNATION) for rid in running.values()}
    found = newest_boundaries(tmp_path / "env_journal", LOG_ID, wanted, end)
    done_continued = 0
    for key, rollout_id in running.items():
        final = agents.conversations[key]
        newest_ok = max((i for i in range(1, len(final))
                         if all((s.policy_version or 0) <= version for s in final[:i + 1])), default=0)
        agent = found.get(rollout_id)
        if agent is None:
            assert newest_ok <= 1, f"{rollout_id} had a committed turn of policy {version} and was not continued"
            continue
        segments = agent.boundary.segments
        assert segments == final[:len(segments)], f"{rollout_id} continues a prefix it never had"
        assert all((s.policy_version or 0) <= version for s in segments)
        if key in agents.sealed:  # sealed after the cut: continued from its done boundary, the whole row
            if all((s.policy_version or 0) <= version for s in final):
                assert agent.boundary.done and segments == final
                done_continued += 1
        else:
            assert not agent.boundary.done
    return len(running), done_continued


def test_seals_racing_journal_cuts_keep_every_row_once_and_continue_exactly_the_rest(tmp_path):
    totals = [0, 0, 0]
    for seed in range(3):
        run_dir = tmp_path / f"seed-{seed}"
        run_dir.mkdir()
        controller, agents, cuts, end = asyncio.run(_scenario(run_dir, seed))
        assert len(cuts) == 12
        for staging, cut, seen, version in cuts:
            running, done_continued = _check_cut(run_dir, agents, staging, cut, seen, version, end)
            totals[0] += running
            totals[1] += done_continued
            totals[2] += len(seen["sealed"])
    running, done_continued, sealed = totals
    # The race really happened: cuts fell between admissions, turns and seals.
    assert running > 0 and done_continued > 0 and sealed > 0, totals


def _check_past_cut(tmp_path, agents: Agents, staging, end, newest_version: int) -> int:
    """Kept past its cut, a restore of any cut is the state at the journal's end: every row ever sealed, once;
    every group admitted; each unsealed sibling continued from its last committed boundary."""
    state, past = resolve_state_past_cut(tmp_path, orjson.loads((staging / STATE_FILE).read_bytes()))
    assert past is not None and past.stopped is None and past.lost_steps == []
    rows = [(r["group_id"], r["sibling"]) for r in state["data_plane"]["rows"]]
    assert len(rows) == len(set(rows)) and set(rows) == set(agents.sealed)
    assert {g["group_id"] for g in state["group_ledger"]["groups"]} == {key[0] for key in agents.conversations}
    running = _running_after_restore(state)
    assert set(running) == set(agents.conversations) - set(agents.sealed)
    wanted = {rid: RunningAgent(max_version=newest_version, incarnation=INCARNATION) for rid in running.values()}
    found = newest_boundaries(tmp_path / "env_journal", LOG_ID, wanted, end)
    for key, rollout_id in running.items():
        assert found[rollout_id].boundary.segments == agents.conversations[key], f"{rollout_id} lost a turn"
    return past.records


def test_kept_past_its_cut_every_cut_restores_every_sealed_row_and_every_committed_turn(tmp_path):
    controller, agents, cuts, end = asyncio.run(_scenario(tmp_path, seed=7))
    records = [_check_past_cut(tmp_path, agents, staging, end, controller.training.policy_version)
               for staging, *_ in cuts]
    assert records[0] > records[-1] >= 0 and agents.sealed  # earlier cuts had more to keep

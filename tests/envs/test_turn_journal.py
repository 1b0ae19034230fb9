import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from turnkeep.envs.turn_journal import TurnJournal, newest_boundaries
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.schemas.participant import RunningAgent
from turnkeep.schemas.rollout import Problem, RolloutRequest, Segment, TurnBoundary

REPO = Path(__file__).resolve().parents[2]
LOG_ID = "env/test"


def request(rollout_id: str, incarnation: int = 1) -> RolloutRequest:
    group_id, sibling, attempt = rollout_id.rsplit(".", 2)
    return RolloutRequest(rollout_id=rollout_id, group_id=group_id, sibling=int(sibling), attempt=int(attempt),
                          incarnation=incarnation, problem=Problem(question="Q 1+2", answer=3))


def want(max_version: int, incarnation: int = 1) -> RunningAgent:
    return RunningAgent(max_version=max_version, incarnation=incarnation)


def conversation(turns: list[int]) -> list[Segment]:
    """A prompt, then per turn a policy segment of that policy version and a tool segment."""
    segments = [Segment(kind="prompt", token_ids=[1, 2, 3])]
    for version in turns:
        segments.append(Segment(kind="policy", token_ids=[7, version], logprobs=[-0.5, -0.25], policy_version=version))
        segments.append(Segment(kind="tool", token_ids=[9]))
    return segments


def commit_turns(records: TurnRecords, rollout_id: str, versions: list[int], done_at_end: bool = False,
                 incarnation: int = 1) -> None:
    for turn in range(1, len(versions) + 1):
        done = done_at_end and turn == len(versions)
        boundary = TurnBoundary(rollout_id=rollout_id, turn_index=turn, segments=conversation(versions[:turn]),
                                done=done)
        records.commit(boundary, request=request(rollout_id, incarnation), env=None)


def test_the_newest_boundary_within_the_restored_policy_is_rebuilt_turn_for_turn(tmp_path):
    journal = TurnJournal(tmp_path, LOG_ID, segment_bytes=512)
    records = TurnRecords(journal)
    commit_turns(records, "g1.0.0", [3, 4, 5])  # its third turn came from policy 5
    commit_turns(records, "g1.1.0", [3, 3], done_at_end=True)
    commit_turns(records, "g2.0.1", [4])
    commit_turns(records, "g9.0.0", [1])  # not wanted by the restore
    end = asyncio.run(journal.sync())
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(4), "g1.1.0": want(4), "g2.0.1": want(3),
                                                      "g3.0.0": want(9)}, end)
    assert sorted(saved) == ["g1.0.0", "g1.1.0"]  # g2.0.1's only turn is from policy 4 > 3; g3 never ran here
    assert saved["g1.0.0"].boundary.turn_index == 2
    assert saved["g1.0.0"].boundary.segments == conversation([3, 4])
    assert saved["g1.1.0"].boundary.done and saved["g1.1.0"].boundary.segments == conversation([3, 3])
    assert saved["g1.0.0"].request == request("g1.0.0")


def test_a_continuation_starts_a_conversation_of_its_own(tmp_path):
    journal = TurnJournal(tmp_path, LOG_ID)
    records = TurnRecords(journal)
    commit_turns(records, "g1.0.0", [1, 1])
    records.forget("g1.0.0")
    # Attempt 1 continues attempt 0's second boundary, then adds a turn.
    start = TurnBoundary(rollout_id="g1.0.1", turn_index=2, segments=conversation([1, 1]))
    records.commit(start, request=request("g1.0.1"), env=None)
    records.commit(TurnBoundary(rollout_id="g1.0.1", turn_index=3, segments=conversation([1, 1, 2])),
                   request=request("g1.0.1"), env=None)
    end = asyncio.run(journal.sync())
    saved = newest_boundaries(tmp_path, LOG_ID, {"g1.0.1": want(2)}, end)
    assert saved["g1.0.1"].boundary.turn_index == 3 and saved["g1.0.1"].boundary.segments == conversation([1, 1, 2])


def test_a_rollout_id_of_another_lineage_is_never_continued(tmp_path):
    """Rollout ids repeat across lineages (a restore admits the same prompts again). Incarnation 1 ran g5 past the
    snapshot that incarnation 2 restored; incarnation 2 admitted g5 again, and incarnation 3 restores a cut of
    incarnation 2. Policy version 6 means different weights on the two lineages: only incarnation 2's turns count,
    even when incarnation 1's conversation comes later in the journal or is the only one there."""
    journal = TurnJournal(tmp_path, LOG_ID)
    records = TurnRecords(journal)
    commit_turns(records, "g5.0.0", [5, 6], incarnation=2)
    records.forget("g5.0.0")
    commit_turns(records, "g5.0.0", [5, 6, 6], incarnation=1)  # an older lineage, read after ours
    records.forget("g5.0.0")
    commit_turns(records, "g6.0.0", [6], incarnation=1)  # only the abandoned lineage ran g6
    end = asyncio.run(journal.sync())
    saved = newest_boundaries(tmp_path, LOG_ID, {"g5.0.0": want(6, incarnation=2), "g6.0.0": want(6, 2)}, end)
    assert sorted(saved) == ["g5.0.0"]
    assert saved["g5.0.0"].boundary.segments == conversation([5, 6])
    assert saved["g5.0.0"].request.incarnation == 2
    # Without the incarnation check the newer-looking foreign conversation would have won.
    assert newest_boundaries(tmp_path, LOG_ID, {"g5.0.0": want(6, 1)}, end)["g5.0.0"].boundary.turn_index == 3


WRITER = r"""
import asyncio, random, sys
from pathlib import Path
from turnkeep.envs.turn_journal import TurnJournal
from turnkeep.envs.turn_records import TurnRecords
from tests.envs.test_turn_journal import LOG_ID, conversation, request
from turnkeep.schemas.rollout import TurnBoundary

async def main():
    journal = TurnJournal(Path(sys.argv[1]), LOG_ID, segment_bytes=2048)
    records = TurnRecords(journal)
    rng = random.Random(int(sys.argv[2]))
    flusher = asyncio.create_task(journal.flush_forever(0.005))
    turns = {}
    while True:
        rid = f"g{rng.randrange(20)}.0.0"
        versions = turns.setdefault(rid, [])
        versions.append(len(versions))
        records.commit(TurnBoundary(rollout_id=rid, turn_index=len(versions), segments=conversation(versions)),
                       request=request(rid), env=None)
        await journal.sync()
        print(rid, len(versions), flush=True)
        await asyncio.sleep(0)

asyncio.run(main())
"""


def test_every_boundary_reported_durable_survives_a_kill(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "5"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline()
    time.sleep(random.uniform(0.3, 0.8))
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    durable: dict[str, int] = {}
    for line in out.decode().splitlines():
        rid, turn = line.split()
        durable[rid] = int(turn)
    assert len(durable) > 5
    assert len(list(tmp_path.glob("*.seg"))) > 1  # segments rotated while it ran
    journal = TurnJournal(tmp_path, LOG_ID)  # a restarted server reopens it, cutting off a torn tail
    end = journal.position()
    saved = newest_boundaries(tmp_path, LOG_ID, {rid: want(10**6) for rid in durable}, end)
    for rid, turn in durable.items():
        assert saved[rid].boundary.turn_index >= turn
        assert saved[rid].boundary.segments == conversation(list(range(saved[rid].boundary.turn_index)))


def test_the_audit_log_is_flushed_before_each_journal_batch_reaches_the_disk(tmp_path):
    """A boundary the journal keeps must be in the audit log too, or the invariant checker cannot verify its
    continuation: the hook runs before the batch is written, every time, the background flusher's too."""
    on_disk_at_hook: list[int] = []

    def bytes_on_disk() -> int:
        return sum(path.stat().st_size for path in tmp_path.glob("*.seg"))

    journal = TurnJournal(tmp_path, LOG_ID, before_sync=lambda: on_disk_at_hook.append(bytes_on_disk()))
    records = TurnRecords(journal)

    async def scenario() -> None:
        commit_turns(records, "g1.0.0", [1])
        await journal.sync()
        commit_turns(records, "g2.0.0", [1])
        flusher = asyncio.create_task(journal.flush_forever(0.01))
        await asyncio.sleep(0.1)
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)

    asyncio.run(scenario())
    # Each time before its batch: nothing of g1 yet, then g1 but not g2; at the end both.
    first, second = on_disk_at_hook[:2]
    assert first < second < bytes_on_disk()
    assert sorted(newest_boundaries(tmp_path, LOG_ID, {"g1.0.0": want(9), "g2.0.0": want(9)},
                                    journal.position())) == ["g1.0.0", "g2.0.0"]

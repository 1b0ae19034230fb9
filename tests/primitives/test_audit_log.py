"""The audit log: typed lines, flushed in batches, shared by two writers, a torn tail skipped."""

from __future__ import annotations

import asyncio

from primitives.audit_log import AUDIT_FILE, AuditLog, read_audit, segments_digest
from schemas.audit import GroupAdmitted, StepTrained, TurnCommitted
from schemas.rollout import Segment


def test_two_writers_share_one_file_and_a_torn_tail_is_skipped(tmp_path) -> None:
    controller, env = AuditLog(tmp_path / AUDIT_FILE, 2), AuditLog(tmp_path / AUDIT_FILE, 2)
    controller.emit(GroupAdmitted, group_id="g1", size=2)
    env.emit(TurnCommitted, rollout_id="g1.0.0", group_id="g1", sibling=0, attempt=0, turn=1, policy_version=3,
             tokens=5)
    assert list(read_audit(tmp_path)) == []  # nothing is written before a flush
    env.flush()
    controller.flush()
    with open(tmp_path / AUDIT_FILE, "ab") as f:
        f.write(b'{"t": 1, "inc": 2, "event": "step_tr')  # a crash in the middle of a line
    events = list(read_audit(tmp_path))
    assert [e.event for e in events] == ["turn_committed", "group_admitted"]
    assert all(e.inc == 2 for e in events)


def test_the_background_task_flushes_and_close_writes_the_rest(tmp_path) -> None:
    async def scenario() -> None:
        log = AuditLog(tmp_path / AUDIT_FILE, 1, flush_interval_s=0.01)
        log.start()
        log.emit(GroupAdmitted, group_id="g1", size=2)
        await asyncio.sleep(0.1)
        assert [e.event for e in read_audit(tmp_path)] == ["group_admitted"]
        log.emit(StepTrained, step=1, policy_version=1, group_ids=["g1"])
        await log.close()

    asyncio.run(scenario())
    assert [e.event for e in read_audit(tmp_path)] == ["group_admitted", "step_trained"]


def test_the_segments_digest_ignores_logprobs_but_not_tokens_or_versions() -> None:
    base = [Segment(kind="prompt", token_ids=[1, 2]), Segment(kind="policy", token_ids=[3], logprobs=[-0.1],
                                                             policy_version=4)]
    same = [base[0], base[1].model_copy(update={"logprobs": [-0.2]})]
    other_version = [base[0], base[1].model_copy(update={"policy_version": 5})]
    other_tokens = [base[0], base[1].model_copy(update={"token_ids": [4]})]
    assert segments_digest(base) == segments_digest(same)
    assert segments_digest(base) != segments_digest(other_version)
    assert segments_digest(base) != segments_digest(other_tokens)

"""The policy server's own Temporal activities, run in its process against the real engine:
fence and drain, commit, resume, weight loads, and their refusals."""

from __future__ import annotations

import uuid

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoModelForCausalLM

from turnkeep.activities.policy_activities import PolicyActivities
from turnkeep.gpu_workers.weights_blob import pack_state_dict
from turnkeep.schemas.attempt_steps import GymInput
from turnkeep.schemas.names import ErrorType, snapshot_holder
from turnkeep.schemas.participant import FaultPlan
from turnkeep.schemas.recovery import PolicyLoadInput

INCARNATION = 3


def _activities(policy_server, tiny_model_dir) -> PolicyActivities:
    async def trainer_weights() -> bytes:
        return pack_state_dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())

    return PolicyActivities(policy_server, policy_server.faults, INCARNATION, trainer_weights)


def _call(loop, fn, arg):
    async def run():
        return await ActivityEnvironment().run(fn, arg)

    return loop.run(run(), timeout=60)


def test_prepare_fences_commit_records_the_version_and_resume_reopens(loop, policy_server, tiny_model_dir, tmp_path):
    acts = _activities(policy_server, tiny_model_dir)
    number = uuid.uuid4().int % 10**6 + 1
    ck = f"r.snapshot.1.{number}"
    staging = tmp_path / "checkpoints" / "step_1" / "snapshots" / f".staging-{number}-0a1b2c"
    gym = GymInput(run_id="r", checkpoint_id=ck, incarnation=INCARNATION, lease_s=30, staging_dir=str(staging))
    prepared = _call(loop, acts.prepare, gym)
    assert prepared.participant_s >= 0 and snapshot_holder(ck) in policy_server.gate.holders()
    for elsewhere in (str(tmp_path), str(staging / ".." / ".." / ".."), str(staging).replace("step_1", "step_2")):
        with pytest.raises(ApplicationError) as err:  # the participant writes only into its attempt's staging
            _call(loop, acts.commit, gym.model_copy(update={"staging_dir": elsewhere}))
        assert err.value.type == ErrorType.INVALID_INPUT and err.value.non_retryable
    assert not (tmp_path / "policy").exists()
    committed = _call(loop, acts.commit, gym)
    assert [a.path for a in committed.artifacts] == ["policy.0/state.json"]  # engine 0 of the run
    assert committed.counts == {"policy_version": policy_server.policy_version}

    other = gym.model_copy(update={"checkpoint_id": f"{ck}-other"})
    with pytest.raises(ApplicationError) as err:  # a second coordinator: a bug, never retried
        _call(loop, acts.prepare, other)
    assert err.value.type == ErrorType.INVARIANT_BROKEN and err.value.non_retryable
    with pytest.raises(ApplicationError) as err:  # a dead controller's attempt
        _call(loop, acts.prepare, gym.model_copy(update={"incarnation": INCARNATION - 1}))
    assert err.value.type == ErrorType.STALE_INCARNATION

    policy_server.faults.set(FaultPlan(fail={"resume": 1}))
    with pytest.raises(ApplicationError) as err:  # an injected transient failure: retried by the workflow
        _call(loop, acts.resume, gym)
    assert not err.value.non_retryable and snapshot_holder(ck) in policy_server.gate.holders()
    assert _call(loop, acts.resume, gym).participant_s >= 0
    assert snapshot_holder(ck) not in policy_server.gate.holders()
    # Idempotent, and a stale incarnation's release is a no-op.
    _call(loop, acts.resume, gym)
    _call(loop, acts.abort, gym.model_copy(update={"incarnation": INCARNATION - 1}))


def test_load_weights_fetches_the_trainers_weights_and_serves_them_as_the_restored_version(
    loop, policy_server, tiny_model_dir
):
    acts = _activities(policy_server, tiny_model_dir)
    # The version it serves, with the weights it started from: a restore at the step it is at, and the
    # shared server stays as the other tests expect it.
    version = policy_server.policy_version
    expected = len(pack_state_dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()))
    loaded = _call(loop, acts.load_weights, PolicyLoadInput(run_id="r", incarnation=INCARNATION,
                                                             policy_version=version))
    assert loaded.bytes == expected and loaded.seconds > 0
    assert policy_server.policy_version == version and policy_server.weights_ok
    if version >= 1:
        with pytest.raises(ValueError, match="refusing weights"):  # a late retry never rolls the policy back
            _call(loop, acts.load_weights, PolicyLoadInput(run_id="r", incarnation=INCARNATION,
                                                            policy_version=version - 1))
    with pytest.raises(ApplicationError) as err:  # refused before the trainer's weights are even fetched
        _call(loop, acts.load_weights, PolicyLoadInput(run_id="r", incarnation=INCARNATION, policy_version=-1))
    assert err.value.type == ErrorType.INVALID_INPUT and policy_server.policy_version == version

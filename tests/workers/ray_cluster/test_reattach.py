"""Which processes a restarted controller re-attaches to: only this run's, started with this
config, all of them answering."""

from __future__ import annotations

import asyncio

import turnkeep.workers.ray_cluster.reattach as reattach
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.reattach import _identities
from turnkeep.workers.ray_cluster.survivors import Found

STAMP = {"run_id": "run-1", "digest": "abc"}


class _Method:
    def __init__(self, reply, delay_s: float = 0.0) -> None:
        self._reply, self._delay_s = reply, delay_s

    def remote(self):
        async def call():
            await asyncio.sleep(self._delay_s)
            if isinstance(self._reply, Exception):
                raise self._reply
            return self._reply

        return call()


class _Actor:
    def __init__(self, identity, delay_s: float = 0.0) -> None:
        self.identity = _Method(identity, delay_s)


def _found(trainer=STAMP, policy=STAMP, env=STAMP, delays: dict[str, float] | None = None) -> Found:
    delays = delays or {}
    make = lambda stamp, name: None if stamp is None else _Actor(stamp, delays.get(name, 0.0))  # noqa: E731
    engine = make(policy, "policy.0")
    return Found(make(trainer, "trainer"), {} if engine is None else {0: engine}, make(env, "env"), 0)


def _problem(found: Found) -> str | None:
    return asyncio.run(_identities(found, TurnkeepConfig(), STAMP))[1]


def test_all_three_of_this_run_with_this_config_are_reused() -> None:
    identities, problem = asyncio.run(_identities(_found(), TurnkeepConfig(), STAMP))
    assert problem is None and set(identities) == {"trainer", "policy.0", "env"}


def test_a_missing_process_means_a_fresh_start() -> None:
    assert _problem(_found(env=None)) == "env not running"


def test_another_runs_process_is_not_reused() -> None:
    assert _problem(_found(policy={**STAMP, "run_id": "run-2"})) == "policy.0 belongs to another run"
    assert _problem(_found(trainer={})) == "trainer belongs to another run"  # never stamped


def test_a_process_started_with_other_settings_is_not_reused() -> None:
    assert _problem(_found(trainer={**STAMP, "digest": "def"})) == "trainer was started with other settings"


def test_a_process_that_does_not_answer_is_not_reused(monkeypatch) -> None:
    monkeypatch.setattr(reattach, "IDENTITY_TIMEOUT_S", 0.2)
    assert _problem(_found(delays={"policy.0": 5.0})) == "policy.0 does not answer (TimeoutError)"
    assert _problem(_found(env=RuntimeError("actor died"))) == "env does not answer (RuntimeError)"


def test_every_configured_engine_must_be_there_to_reuse_them() -> None:
    cfg = TurnkeepConfig.model_validate({"policy": {"engines": 2}})
    assert asyncio.run(_identities(_found(), cfg, STAMP))[1] == "policy.1 not running"

"""Which processes a restarted controller re-attaches to: only this run's, started with this
config, all of them answering; the newest environment server if it was restarted."""

from __future__ import annotations

import asyncio

import pytest

import turnkeep.workers.ray_cluster.survivors as survivors
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.survivors import Found, _identities, find_survivors

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
    monkeypatch.setattr(survivors, "IDENTITY_TIMEOUT_S", 0.2)
    assert _problem(_found(delays={"policy.0": 5.0})) == "policy.0 does not answer (TimeoutError)"
    assert _problem(_found(env=RuntimeError("actor died"))) == "env does not answer (RuntimeError)"


@pytest.mark.parametrize("names, chosen, restarts", [
    ({"trainer", "policy.0", "env"}, "env", 0),
    ({"trainer", "policy.0", "policy.1", "env-restart-1", "env-restart-3"}, "env-restart-3", 3),
    ({"trainer", "policy.0"}, None, 0),
])
def test_the_newest_environment_server_is_the_one_found(monkeypatch, names, chosen, restarts) -> None:
    monkeypatch.setattr(survivors.ray.util, "list_named_actors", lambda: sorted(names))
    monkeypatch.setattr(survivors.ray, "get_actor", lambda name: f"handle:{name}")
    found = find_survivors()
    assert found.env == (f"handle:{chosen}" if chosen else None) and found.env_restarts == restarts
    assert found.trainer == "handle:trainer" and found.engines[0] == "handle:policy.0"
    assert set(found.engines) == {k for k in (0, 1) if f"policy.{k}" in names}


def test_every_configured_engine_must_be_there_to_reuse_them() -> None:
    cfg = TurnkeepConfig.model_validate({"policy": {"engines": 2}})
    assert asyncio.run(_identities(_found(), cfg, STAMP))[1] == "policy.1 not running"

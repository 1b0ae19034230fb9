"""What a controller of the run left running is found by name: the newest environment server if it was
restarted."""

from __future__ import annotations

import pytest

import turnkeep.workers.ray_cluster.survivors as survivors
from turnkeep.workers.ray_cluster.survivors import find_survivors


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

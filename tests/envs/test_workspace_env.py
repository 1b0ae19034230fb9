"""The workspace environment: a calculator whose results land in a file, exported and restored."""

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from turnkeep.envs.calc_task import parse_action, run_tool
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.workspace_env import WorkspaceEnvironment
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 37+48-12", answer=73, env="workspace")
PERFECT = ["C 37+48\n", "C 85-12\n", "A 73\n"]


async def _play(env: WorkspaceEnvironment, turns: list[str]) -> list[str | None]:
    return [(await env.step(turn)).observation for turn in turns]


def test_correct_episode_scores_one_and_writes_the_tape(tmp_path: Path) -> None:
    async def main() -> None:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path / "root"))
        assert env.prompt() == "Q 37+48-12\n" and env.workspace is None  # lazy: nothing on disk yet
        observations = await _play(env, PERFECT)
        assert observations == [run_tool(parse_action(t)) for t in PERFECT[:2]] + [None]
        assert env.workspace is not None and env.workspace.parent == tmp_path / "root"
        assert env.workspace.name.startswith("ws-")
        assert (env.workspace / "tape").read_text() == "85\n73\n"
        assert env.reward() == 1.0
        await env.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "turns",
    [
        ["C 37+48\n", "C 85-12\n", "A 74\n"],  # wrong answer
        ["C 37+48\n", "A 73\n"],  # skipped a call
        ["C 37+48\n", "oops\n"],  # malformed turn
    ],
)
def test_wrong_episode_scores_zero(tmp_path: Path, turns: list[str]) -> None:
    async def main() -> None:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        results = [await env.step(t) for t in turns]
        assert results[-1].done and results[-1].observation is None
        assert env.reward() == 0.0
        await env.close()

    asyncio.run(main())


def test_the_reward_reads_the_tape_from_disk(tmp_path: Path) -> None:
    async def main() -> None:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        await _play(env, PERFECT)
        assert env.workspace is not None
        (env.workspace / "tape").write_text("85\n")  # the tool's state lost a result
        assert env.reward() == 0.0
        await env.close()

    asyncio.run(main())


def test_export_then_restore_into_a_fresh_env_continues_to_one(tmp_path: Path) -> None:
    async def main() -> None:
        first = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        await _play(first, PERFECT[:1])
        state = first.export_state()
        assert state == {"turns": ["C 37+48\n"], "files": {"tape": "85\n"}}
        await first.close()  # the original workspace is gone: only the state carries the tape

        restored = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        restored.restore_state(state)
        assert restored.workspace is not None and (restored.workspace / "tape").read_text() == "85\n"
        assert await _play(restored, PERFECT[1:]) == ["R 73\n", None]
        assert restored.reward() == 1.0
        await restored.close()

    asyncio.run(main())


def test_a_restart_without_the_files_scores_zero(tmp_path: Path) -> None:
    async def main() -> None:
        # Same turns, but the tape's first line was never written: the reward notices.
        lost = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        lost.restore_state({"turns": PERFECT[:1], "files": {}})
        await _play(lost, PERFECT[1:])
        assert lost.reward() == 0.0
        await lost.close()
        # A fresh env with no restore at all, continued from the same point.
        fresh = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        await _play(fresh, PERFECT[1:])
        assert fresh.reward() == 0.0
        await fresh.close()

    asyncio.run(main())


def test_export_before_any_call_has_no_files() -> None:
    assert WorkspaceEnvironment(PROBLEM).export_state() == {"turns": [], "files": {}}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([], "must be a dict"),
        ({"turns": []}, "missing 'files'"),
        ({"files": {}}, "missing 'turns'"),
        ({"turns": [], "files": {}, "cwd": "/"}, "unknown keys"),
        ({"turns": "C 1+2\n", "files": {}}, "'turns' must be a list of strings"),
        ({"turns": [1], "files": {}}, "'turns' must be a list of strings"),
        ({"turns": [], "files": [["tape", "1\n"]]}, "'files' must be a dict"),
        ({"turns": [], "files": {"../escape": "1\n"}}, "bad file name '../escape'"),
        ({"turns": [], "files": {"sub/tape": "1\n"}}, "bad file name 'sub/tape'"),
        ({"turns": [], "files": {"..": "1\n"}}, "bad file name '..'"),
        ({"turns": [], "files": {"": "1\n"}}, "bad file name ''"),
        ({"turns": [], "files": {"tape": b"1\n"}}, "'tape' must have string contents"),
    ],
)
def test_restore_rejects_bad_shapes(tmp_path: Path, state: Any, message: str) -> None:
    env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
    with pytest.raises(ValueError, match=re.escape(message)):
        env.restore_state(state)
    assert env.workspace is None and list(tmp_path.iterdir()) == []  # nothing written


def test_restore_needs_a_fresh_env(tmp_path: Path) -> None:
    async def main() -> None:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        await env.step(PERFECT[0])
        with pytest.raises(RuntimeError, match="fresh"):
            env.restore_state({"turns": [], "files": {}})
        await env.close()

    asyncio.run(main())


def test_replay_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="cannot be replayed"):
        asyncio.run(WorkspaceEnvironment(PROBLEM).replay(PERFECT))


def test_close_removes_the_folder_and_is_idempotent(tmp_path: Path) -> None:
    async def main() -> None:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(workspace_root=tmp_path))
        await env.step(PERFECT[0])
        folder = env.workspace
        assert folder is not None and folder.is_dir()
        await env.close()
        assert not folder.exists() and env.workspace is None
        await env.close()
        await WorkspaceEnvironment(PROBLEM).close()  # never started: nothing to remove

    asyncio.run(main())


def test_tool_latency_is_applied(tmp_path: Path) -> None:
    async def main() -> float:
        env = WorkspaceEnvironment(PROBLEM, EnvContext(tool_latency_s=0.05, workspace_root=tmp_path))
        loop = asyncio.get_running_loop()
        start = loop.time()
        await env.step(PERFECT[0])
        elapsed = loop.time() - start
        await env.close()
        return elapsed

    assert asyncio.run(main()) >= 0.05

"""A SIGKILL from outside in the middle of a trainer checkpoint (every file written, no manifest, not renamed)
and in the middle of a prune (the old one renamed away, not deleted): the checkpoints that were published
still verify, nothing half-written carries a published name, and the next start's cleanup removes the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.controller.stores.test_trainer_checkpoint import IDENTITY
from turnkeep.controller.restore.verify import verify_trainer_checkpoint
from turnkeep.controller.stores.trainer_checkpoint import checkpoint_root, fingerprint_of, published_steps
from turnkeep.primitives.atomic_files import is_staging_name, remove_stale_staging
from turnkeep.primitives.chaos_points import ENV_POINT, ENV_WAIT, marker_path

REPO = Path(__file__).resolve().parents[3]

WRITER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from tests.controller.stores.test_trainer_checkpoint import IDENTITY, FakeTrainer
    from turnkeep.controller.stores.trainer_checkpoint import write_trainer_checkpoint

    run_dir, keep = Path(sys.argv[1]), int(sys.argv[2])
    for step in map(int, sys.argv[3:]):
        asyncio.run(write_trainer_checkpoint(run_dir, step, FakeTrainer(step), {"step": step}, keep, identity=IDENTITY))
""")


def _write(run_dir: Path, keep: int, steps: list[int], kill_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if kill_at:
        env.update({ENV_POINT: kill_at, ENV_WAIT: "60"})
    return subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(keep), *map(str, steps)], cwd=REPO,
                            env=env)


def _kill_at_marker(proc: subprocess.Popen, run_dir: Path, point: str) -> None:
    deadline = time.monotonic() + 60
    while not marker_path(run_dir).exists():
        assert proc.poll() is None, f"the writer exited ({proc.returncode}) before reaching {point}"
        assert time.monotonic() < deadline, f"{point} never reached"
        time.sleep(0.02)
    assert marker_path(run_dir).read_text().startswith(point)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def _verifies(run_dir: Path, step: int) -> bool:
    manifest, skipped = verify_trainer_checkpoint(checkpoint_root(run_dir) / f"step_{step}", IDENTITY.run_id,
                                                  fingerprint_of(IDENTITY.fingerprint_fields))
    return manifest is not None and skipped is None


@pytest.mark.parametrize(("point", "published", "leftover"), [
    ("checkpoint_write", [4, 8], "step_12"),  # the third was being written
    ("prune", [8, 12], "removed-step_4"),     # the third was published, the first was being pruned
])
def test_a_kill_mid_write_or_mid_prune_leaves_only_whole_checkpoints(tmp_path, point, published, leftover):
    assert _write(tmp_path, 2, [4, 8]).wait(timeout=120) == 0
    _kill_at_marker(_write(tmp_path, 2, [12], kill_at=point), tmp_path, point)
    root = checkpoint_root(tmp_path)
    assert published_steps(tmp_path) == published
    assert all(_verifies(tmp_path, step) for step in published)
    left = [p.name for p in root.iterdir() if is_staging_name(p.name)]
    assert len(left) == 1 and leftover in left[0], left
    # The next start's cleanup removes the half-written or half-removed directory, nothing else.
    assert [p.name for p in remove_stale_staging(root)] == left
    assert sorted(p.name for p in root.iterdir()) == sorted(f"step_{s}" for s in published)

"""The W&B mirror of metrics.jsonl, with the real wandb package in offline mode: each line sent exactly once across a
restart, train numbers against train/step (a restore may send it back), snapshots and restores beside them."""

import time
from pathlib import Path

import orjson
import pytest

from tests.controller.stores.wandb_records import history_points
from turnkeep.controller.stores.wandb_mirror import WandbMirror, WandbUnavailable, check_wandb_installed, resolved_mode
from turnkeep.schemas.config import MetricsConfig

OFFLINE = MetricsConfig(wandb=True, wandb_mode="offline", wandb_project="tk-test")


def _append(run_dir: Path, *lines: dict) -> None:
    with (run_dir / "metrics.jsonl").open("ab") as out:
        for line in lines:
            out.write(orjson.dumps(line) + b"\n")


def _step(step: int, reward: float) -> dict:
    return {"kind": "train_step", "t": 1.0, "step": step, "reward_mean": reward, "groups_discarded_total": {"stale": 1}}


def _points(run_dir: Path) -> list[dict]:
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return [row for path in files for row in history_points(path)]


@pytest.fixture(autouse=True)
def _no_wandb_account(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc from `wandb login`
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def test_every_line_reaches_w_and_b_once_across_a_restart(tmp_path):
    _append(tmp_path, _step(1, 0.1), _step(2, 0.2),
            {"kind": "snapshot", "t": 2.0, "anchor_step": 2, "outcome": "published", "seconds": {"total": 0.4}})
    first = WandbMirror(tmp_path, "run-1", OFFLINE)
    assert first.mirror_new_lines() == 3
    _append(tmp_path, {"kind": "recovery", "incarnation": 2, "source": {"kind": "snapshot", "step": 2}})
    first.close()  # the restart's recovery line was appended before the first mirror's last look
    _append(tmp_path, _step(2, 0.25), _step(3, 0.3))
    time.sleep(1.1)  # W&B names an offline run's folder by the second it started; a real restart takes far longer
    second = WandbMirror(tmp_path, "run-1", OFFLINE)  # the restarted run: the offset says where to go on
    second.close()

    expected = [(1, 0.1), (2, 0.2), (2, 0.25), (3, 0.3)]  # step 2 again after the restore, once each
    deadline = time.monotonic() + 20
    while True:  # W&B's own service writes the data file; `finish` may return before its last write lands
        points = _points(tmp_path)
        train = [(p["train/step"], p["train/reward_mean"]) for p in points if "train/step" in p]
        if train == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert train == expected
    assert all(p.get("train/groups_discarded_total/stale") == 1 for p in points if "train/step" in p)
    [snapshot] = [p for p in points if "snapshot/anchor_step" in p]
    assert (snapshot["snapshot/published"], snapshot["snapshot/seconds/total"]) == (1, 0.4)
    assert [p["recovery/step"] for p in points if "recovery/step" in p] == [2]
    assert not any("train/t" in p for p in points)


def test_auto_is_offline_without_credentials_and_online_with_a_key(monkeypatch):
    auto = MetricsConfig(wandb=True)
    assert resolved_mode(auto) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolved_mode(auto) == "online"
    assert resolved_mode(OFFLINE) == "offline"


def test_without_the_package_the_start_names_the_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(WandbUnavailable, match=r"pip install 'turnkeep\[wandb\]'"):
        check_wandb_installed()

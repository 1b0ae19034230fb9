"""Choosing where a restarted run continues from, on synthetic run directories."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import orjson
import pytest

from tests.controller.journal.journal_harness import JournaledState
from turnkeep.config.loader import load_config
from turnkeep.controller.fingerprint import fingerprint_fields
from turnkeep.controller.restore.restore_source import choose_source, newest_published_problem
from turnkeep.controller.restore.unusable import UnusableRunDir
from turnkeep.controller.restore.verify import verify_snapshot, verify_trainer_checkpoint
from turnkeep.controller.stores import snapshot_store
from turnkeep.controller.stores.trainer_checkpoint import CheckpointIdentity, fingerprint_of, write_checkpoint_manifest
from turnkeep.primitives import snapshot_paths
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.recovery import SourceKind
from turnkeep.schemas.snapshot import SnapshotManifest

REPO = Path(__file__).resolve().parents[3]
RUN_ID = "run-a"
FIELDS = fingerprint_fields(load_config(REPO / "configs" / "tiny.toml", {}))
FINGERPRINT = fingerprint_of(FIELDS)


def changed_fields(section: str, key: str, value) -> dict:
    fields = copy.deepcopy(FIELDS)
    fields[section][key] = value
    return fields


# ---- builders ----


def make_checkpoint(run_dir: Path, step: int, *, policy_version: int | None = None, run_id: str = RUN_ID,
                    fields: dict = FIELDS) -> Path:
    """A published trainer checkpoint with small stand-ins for the trainer's files."""
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    trainer = ckpt / "trainer"
    (trainer / "shards").mkdir(parents=True)
    (trainer / "rng").mkdir()
    (trainer / "shards" / ".metadata").write_bytes(b"dcp-%d" % step)
    (trainer / "shards" / "__0_0.distcp").write_bytes(b"weights-%d" % step * 10)
    (trainer / "rng" / "rank_0.pt").write_bytes(b"rng")
    atomic_write_json(trainer / "trainer_state.json", {"policy_version": step if policy_version is None else policy_version})
    atomic_write_json(ckpt / "controller_state.json", {"step": step, "data_plane": {"rows": []}})
    write_checkpoint_manifest(ckpt, step, CheckpointIdentity(run_id=run_id, fingerprint_fields=fields))
    return ckpt


def make_snapshot(ckpt: Path, number: int, *, policy_version: int | None = None, run_id: str = RUN_ID,
                  fingerprint: str = FINGERPRINT, controller_state: bytes | None = None) -> Path:
    """A published snapshot: saved agents, the policy's state, the controller's state, manifest last."""
    step = int(ckpt.name.removeprefix("step_"))
    snap = ckpt / "snapshots" / str(number)
    files = {
        "env/agents.jsonl": b'{"rollout_id": "g1.0"}\n{"rollout_id": "g1.1"}\n',
        "policy/state.json": b'{"policy_version": %d}' % step,
        "controller/state.json": controller_state or b'{"step": %d, "n": %d}' % (step, number),
    }
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    manifest = SnapshotManifest(
        run_id=run_id, checkpoint_id=f"{run_id}.snapshot.{step}.{number}", anchor_step=step, number=number,
        policy_version=step if policy_version is None else policy_version, config_fingerprint=fingerprint,
        created_unix_s=1.0, artifacts=[snapshot_store.artifact_for(snap, snap / rel) for rel in sorted(files)],
        counts={"parked_agents": 2},
    )
    (snap / snapshot_paths.MANIFEST).write_bytes(manifest.model_dump_json().encode())
    return snap


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def rewrite_manifest(snap: Path, **changes) -> None:
    raw = orjson.loads((snap / "manifest.json").read_bytes())
    raw.update(changes)
    (snap / "manifest.json").write_bytes(orjson.dumps(raw))


# ---- the normal case ----


def test_no_checkpoints_starts_fresh(tmp_path: Path) -> None:
    for run_dir in (tmp_path, _with_empty_checkpoints(tmp_path / "b")):
        source = choose_source(run_dir, RUN_ID, FIELDS)
        assert source.kind is SourceKind.FRESH
        assert (source.step, source.policy_version) == (0, 0)
        assert source.reason == "no trainer checkpoint yet: starting from step 0"


def _with_empty_checkpoints(run_dir: Path) -> Path:
    # A checkpoint still in staging when the run died does not count as one.
    (run_dir / "checkpoints" / ".staging-step_20-abc" / "trainer").mkdir(parents=True)
    return run_dir


def test_newest_valid_snapshot_of_newest_checkpoint_is_chosen(tmp_path: Path) -> None:
    make_snapshot(make_checkpoint(tmp_path, 20), 1)
    ckpt = make_checkpoint(tmp_path, 40)
    make_snapshot(ckpt, 1)
    snap = make_snapshot(ckpt, 2)

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.SNAPSHOT
    assert (source.step, source.policy_version) == (40, 40)
    assert source.checkpoint_dir == str(ckpt.absolute())
    assert source.snapshot_dir == str(snap.absolute())
    assert source.controller_state == str(snap / "controller" / "state.json")
    assert source.agents_files == [str(snap / "env" / "agents.jsonl")]
    assert source.skipped == []
    assert source.reason == "newest snapshot checkpoints/step_40/snapshots/2 (step 40, policy version 40)"


def test_staging_and_unpublished_snapshot_dirs_are_never_read(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    good = make_snapshot(ckpt, 1)
    (ckpt / "snapshots" / ".staging-3-abc" / "env").mkdir(parents=True)
    (ckpt / "snapshots" / ".staging-3-abc" / "manifest.json").write_bytes(b"{torn")
    (ckpt / "snapshots" / "2" / "env").mkdir(parents=True)  # renamed without a manifest: never published
    (tmp_path / "checkpoints" / ".staging-step_60-abc").mkdir()
    (tmp_path / "checkpoints" / "notes").mkdir()

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.SNAPSHOT
    assert source.snapshot_dir == str(good.absolute())
    assert source.skipped == []


# ---- a bad newest snapshot falls back to the older one ----


def _truncate(snap: Path) -> None:
    path = snap / "env" / "agents.jsonl"
    path.write_bytes(path.read_bytes()[:-5])


def _missing(snap: Path) -> None:
    (snap / "policy" / "state.json").unlink()


def _torn_manifest(snap: Path) -> None:
    path = snap / "manifest.json"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _newer_schema(snap: Path) -> None:
    rewrite_manifest(snap, schema_version=2, written_with="a field this turnkeep does not know")


BAD_SNAPSHOTS = {
    "truncated": (_truncate, "env/agents.jsonl"),
    "digest_mismatch": (lambda snap: flip_byte(snap / "env" / "agents.jsonl"), "env/agents.jsonl"),
    "foreign_run": (lambda snap: rewrite_manifest(snap, run_id="run-b"), "run-b"),
    "newer_schema": (_newer_schema, "schema 2, this one reads up to 1"),
    "fingerprint_differs": (lambda snap: rewrite_manifest(snap, config_fingerprint="0" * 16), "0" * 16),
    "missing_file": (_missing, "policy/state.json"),
    "unreadable_manifest": (_torn_manifest, "manifest.json"),
    "policy_version_mismatch": (lambda snap: rewrite_manifest(snap, policy_version=39), "policy version 39"),
}


@pytest.mark.parametrize("problem", sorted(BAD_SNAPSHOTS))
def test_a_bad_newest_snapshot_is_reported_and_the_older_one_used(tmp_path: Path, problem: str) -> None:
    damage, named = BAD_SNAPSHOTS[problem]
    ckpt = make_checkpoint(tmp_path, 40)
    older = make_snapshot(ckpt, 2)
    newest = make_snapshot(ckpt, 3)
    damage(newest)

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.OLDER_SNAPSHOT
    assert source.snapshot_dir == str(older.absolute())
    assert [(s.path, s.problem) for s in source.skipped] == [(str(newest), problem)]
    assert named in source.skipped[0].detail
    assert source.reason.startswith(f"snapshot checkpoints/step_40/snapshots/3 failed verification ({problem}: ")
    assert source.reason.endswith("; using the older snapshot checkpoints/step_40/snapshots/2 (step 40, policy version 40)")


def test_verification_names_expected_and_found(tmp_path: Path) -> None:
    snap = make_snapshot(make_checkpoint(tmp_path, 40), 1)
    _truncate(snap)
    _, skip = verify_snapshot(snap, RUN_ID, FINGERPRINT)
    assert skip.problem == "truncated"
    assert "has 41 bytes, the manifest says 46" in skip.detail
    _, skip = verify_snapshot(snap, "run-b", FINGERPRINT)
    assert skip.problem == "foreign_run"
    assert "'run-a'" in skip.detail and "'run-b'" in skip.detail


@pytest.mark.parametrize("garbage", [b"", b"[1, 2]", b'{"run_id": 3}', b"\xff\xfe", b"null"])
def test_verification_never_raises_on_garbage(tmp_path: Path, garbage: bytes) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    snap = make_snapshot(ckpt, 1)
    (snap / "manifest.json").write_bytes(garbage)
    (ckpt / "checkpoint.json").write_bytes(garbage)
    assert verify_snapshot(snap, RUN_ID, FINGERPRINT)[1].problem == "unreadable_manifest"
    assert verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)[1].problem == "unreadable_manifest"


@pytest.mark.parametrize("bad_path", ["../../trainer/rng.pt", "/etc/hostname", "env/\u0000agents.jsonl"])
def test_an_artifact_path_outside_the_snapshot_is_refused(tmp_path: Path, bad_path: str) -> None:
    snap = make_snapshot(make_checkpoint(tmp_path, 40), 1)
    raw = orjson.loads((snap / "manifest.json").read_bytes())
    raw["artifacts"][0]["path"] = bad_path
    (snap / "manifest.json").write_bytes(orjson.dumps(raw))
    assert verify_snapshot(snap, RUN_ID, FINGERPRINT)[1].problem == "unreadable_manifest"


def test_a_checkpoint_from_a_newer_turnkeep_is_refused_by_name(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    raw = orjson.loads((ckpt / "checkpoint.json").read_bytes())
    (ckpt / "checkpoint.json").write_bytes(orjson.dumps({**raw, "schema_version": 7, "shards": []}))
    _, skip = verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)
    assert skip.problem == "newer_schema"
    assert "written by a newer turnkeep (schema 7, this one reads up to 1); upgrade turnkeep" in skip.detail


def test_paths_are_absolute_for_a_relative_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_snapshot(make_checkpoint(tmp_path / "run", 40), 1)
    monkeypatch.chdir(tmp_path)
    source = choose_source(Path("run"), RUN_ID, FIELDS)
    assert source.snapshot_dir == str(tmp_path / "run" / "checkpoints" / "step_40" / "snapshots" / "1")
    assert all(Path(p).is_absolute() for p in [source.checkpoint_dir, source.controller_state, *source.agents_files])


def test_every_snapshot_bad_falls_back_to_the_trainer_checkpoint(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    flip_byte(make_snapshot(ckpt, 1) / "controller" / "state.json")
    _torn_manifest(make_snapshot(ckpt, 2))

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.TRAINER_CHECKPOINT
    assert (source.step, source.policy_version) == (40, 40)
    assert source.snapshot_dir is None
    assert source.controller_state == str(ckpt / "controller_state.json")
    assert source.agents_files == []
    assert [s.problem for s in source.skipped] == ["unreadable_manifest", "digest_mismatch"]
    assert source.reason.endswith(
        "no snapshot under checkpoints/step_40 verified; using the trainer checkpoint's own data plane "
        "(step 40, policy version 40): running agents continue from the environment servers' turn journals "
        "(those of a server without one start over)"
    )


def _journaled_cut(run_dir: Path) -> dict:
    """A real cut of a journaled state (what `controller/state.json` holds): a journal position, no rows."""
    state = JournaledState()
    journal = state.start(run_dir, 1)
    rng = random.Random(0)
    for _ in range(300):
        state.random_change(rng)
    saved, live = state.cut()
    assert live["data_plane"]["rows"]
    journal.sync_blocking()
    journal.close()
    return saved


def test_a_snapshot_whose_journal_disagrees_is_skipped_for_the_older_one(tmp_path: Path) -> None:
    saved = _journaled_cut(tmp_path)
    ckpt = make_checkpoint(tmp_path, 40)
    older = make_snapshot(ckpt, 1, controller_state=orjson.dumps(saved))
    tampered = {**saved, "journal_ref": {**saved["journal_ref"], "rows": saved["journal_ref"]["rows"] + 1}}
    make_snapshot(ckpt, 2, controller_state=orjson.dumps(tampered))

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.OLDER_SNAPSHOT and source.snapshot_dir == str(older)
    [skip] = source.skipped
    assert skip.problem == "journal_unreadable" and "does not hold what the cut saw" in skip.detail


def test_snapshots_whose_journal_is_gone_fall_back_to_the_trainer_checkpoint(tmp_path: Path) -> None:
    saved = _journaled_cut(tmp_path)
    ckpt = make_checkpoint(tmp_path, 40)
    make_snapshot(ckpt, 1, controller_state=orjson.dumps(saved))
    assert verify_snapshot(ckpt / "snapshots" / "1", RUN_ID, FINGERPRINT)[1] is None
    for segment in (tmp_path / "journal" / "inc-000001").glob("*.seg"):
        segment.unlink()

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.TRAINER_CHECKPOINT
    [skip] = source.skipped
    assert skip.problem == "journal_unreadable" and "cannot be rebuilt from its journal" in skip.detail


def test_a_checkpoint_without_snapshots_is_used_as_it_is(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 20)
    source = choose_source(tmp_path, RUN_ID, FIELDS)
    assert source.kind is SourceKind.TRAINER_CHECKPOINT
    assert source.skipped == []
    assert source.reason.startswith("no published snapshot under checkpoints/step_20; ")


# ---- a bad trainer checkpoint falls back to the older one ----


def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(tmp_path: Path) -> None:
    older = make_checkpoint(tmp_path, 20)
    older_snap = make_snapshot(older, 1)
    newest = make_checkpoint(tmp_path, 40)
    make_snapshot(newest, 1)  # fine by itself, but filed under a damaged checkpoint
    flip_byte(newest / "trainer" / "shards" / "__0_0.distcp")

    source = choose_source(tmp_path, RUN_ID, FIELDS)

    assert source.kind is SourceKind.OLDER_SNAPSHOT
    assert source.step == 20
    assert source.snapshot_dir == str(older_snap.absolute())
    assert [(s.path, s.problem) for s in source.skipped] == [(str(newest), "digest_mismatch")]
    assert "trainer/shards/__0_0.distcp" in source.skipped[0].detail
    assert source.reason.startswith("trainer checkpoint checkpoints/step_40 failed verification (digest_mismatch: ")


def test_a_checkpoint_without_manifest_is_called_old_or_incomplete(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 20)
    (make_checkpoint(tmp_path, 40) / "checkpoint.json").unlink()
    source = choose_source(tmp_path, RUN_ID, FIELDS)
    assert source.step == 20
    assert source.skipped[0].problem == "unreadable_manifest"
    assert "older turnkeep" in source.skipped[0].detail and "incomplete" in source.skipped[0].detail


def test_changed_settings_make_the_run_dir_unusable_and_name_the_setting(tmp_path: Path) -> None:
    make_snapshot(make_checkpoint(tmp_path, 20), 1)
    make_checkpoint(tmp_path, 40)
    now = changed_fields("task", "num_operands", 4)
    now["model"]["tiny"]["hidden_size"] = 256

    with pytest.raises(UnusableRunDir) as refused:
        choose_source(tmp_path, RUN_ID, now)

    message = str(refused.value)
    assert "task.num_operands: saved 3, now 4" in message
    assert "model.tiny.hidden_size: saved 128, now 256" in message
    assert message.count("task.num_operands") == 1  # named once, not once per checkpoint
    assert f"run again with the saved settings (they are in {tmp_path / 'config.json'})" in message
    assert "start a new run with another --run-dir" in message


def test_a_changed_setting_is_named_in_the_checkpoint_skip(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    now = changed_fields("task", "operators", "+-*")
    _, skip = verify_trainer_checkpoint(ckpt, RUN_ID, fingerprint_of(now), now)
    assert skip.problem == "fingerprint_differs"
    assert 'task.operators: saved "+-", now "+-*"' in skip.detail


def test_only_damaged_checkpoints_make_the_run_dir_unusable(tmp_path: Path) -> None:
    flip_byte(make_checkpoint(tmp_path, 20) / "controller_state.json")
    (make_checkpoint(tmp_path, 40) / "trainer" / "rng" / "rank_0.pt").unlink()

    with pytest.raises(UnusableRunDir) as refused:
        choose_source(tmp_path, RUN_ID, FIELDS)

    message = str(refused.value)
    assert "checkpoints/step_40: missing_file: " in message
    assert "checkpoints/step_20: digest_mismatch: " in message
    assert message.index("step_40") < message.index("step_20")
    assert "damaged" in message and "another --run-dir" in message


def test_a_foreign_run_dir_is_unusable(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 20, run_id="run-b")
    with pytest.raises(UnusableRunDir, match="foreign_run"):
        choose_source(tmp_path, RUN_ID, FIELDS)


# ---- the chaos checker's question ----


def test_newest_published_problem(tmp_path: Path) -> None:
    assert newest_published_problem(tmp_path, RUN_ID, FINGERPRINT) is None
    ckpt = make_checkpoint(tmp_path, 40)
    make_snapshot(ckpt, 1)
    newest = make_snapshot(ckpt, 2)
    (ckpt / "snapshots" / "3").mkdir()  # a partial one is not the newest published
    assert newest_published_problem(tmp_path, RUN_ID, FINGERPRINT) is None

    flip_byte(newest / "policy" / "state.json")
    problem = newest_published_problem(tmp_path, RUN_ID, FINGERPRINT)
    assert (problem.path, problem.problem) == (str(newest), "digest_mismatch")


def test_newest_published_problem_checks_the_checkpoint_itself(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    _truncate_file(ckpt / "trainer" / "shards" / "__0_0.distcp")
    assert newest_published_problem(tmp_path, RUN_ID, FINGERPRINT).problem == "truncated"


def _truncate_file(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:2])


# ---- the manifest lists the whole checkpoint ----


def drop_from_manifest(ckpt: Path, rel: str) -> None:
    raw = orjson.loads((ckpt / "checkpoint.json").read_bytes())
    raw["artifacts"] = [a for a in raw["artifacts"] if a["path"] != rel]
    (ckpt / "checkpoint.json").write_bytes(orjson.dumps(raw))


@pytest.mark.parametrize("rel", ["trainer/shards/.metadata", "trainer/rng/rank_0.pt", "trainer/trainer_state.json",
                                 "controller_state.json"])
@pytest.mark.parametrize("file_too", [False, True])
def test_a_manifest_that_lists_no_required_file_is_refused(tmp_path: Path, rel: str, file_too: bool) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    drop_from_manifest(ckpt, rel)
    if file_too:
        (ckpt / rel).unlink()  # written without it: nothing else would notice until the load
    _, skip = verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)
    assert skip.problem == "missing_file"
    assert f"checkpoint.json lists no {rel}" in skip.detail


@pytest.mark.parametrize("stray", ["trainer/model.safetensors.part", "trainer/extra/shard-1.bin", "notes.txt"])
def test_a_file_the_manifest_does_not_list_is_refused(tmp_path: Path, stray: str) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    (ckpt / stray).parent.mkdir(parents=True, exist_ok=True)
    (ckpt / stray).write_bytes(b"never verified")
    _, skip = verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)
    assert skip.problem == "unlisted_file"
    assert f"does not list {stray}" in skip.detail


def test_a_link_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    (ckpt / "trainer" / "weights").symlink_to(tmp_path)
    _, skip = verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)
    assert (skip.problem, "does not list trainer/weights" in skip.detail) == ("unlisted_file", True)


def test_snapshots_are_not_part_of_the_checkpoint_manifest(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path, 40)
    make_snapshot(ckpt, 1)
    (ckpt / "snapshots" / ".staging-2-abc" / "env").mkdir(parents=True)
    assert verify_trainer_checkpoint(ckpt, RUN_ID, FINGERPRINT)[1] is None


def test_a_checkpoint_with_an_unlisted_file_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 20)
    newest = make_checkpoint(tmp_path, 40)
    (newest / "trainer" / "optimizer.pt.orig").write_bytes(b"?")
    source = choose_source(tmp_path, RUN_ID, FIELDS)
    assert (source.kind, source.step) == (SourceKind.TRAINER_CHECKPOINT, 20)
    assert [(s.path, s.problem) for s in source.skipped] == [(str(newest), "unlisted_file")]

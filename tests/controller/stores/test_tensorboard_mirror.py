"""The TensorBoard mirror of metrics.jsonl: the same numbers as scalars, snapshot outcomes and restores as text,
a torn last line left for later, and a restarted run that goes on where the last one stopped (read back from the
event files themselves)."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import orjson
from tensorboardX.proto.event_pb2 import Event

from turnkeep.controller.stores.tensorboard_mirror import TENSORBOARD_DIR, TensorBoardMirror


def _events(run_dir: Path) -> list[Event]:
    """Every event in every event file (TFRecord framing: length, its CRC, the record, its CRC)."""
    events = []
    for path in sorted((run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            record = data[at + 12:at + 12 + length]
            at += 12 + length + 4
            event = Event()
            event.ParseFromString(record)
            events.append(event)
    return events


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for event in _events(run_dir):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                found.setdefault(value.tag, []).append((event.step, round(value.simple_value, 4)))
    return {tag: sorted(points) for tag, points in found.items()}  # event files of one second sort at random


def _append(run_dir: Path, *lines: dict, torn: bytes = b"") -> None:
    with (run_dir / "metrics.jsonl").open("ab") as f:
        f.write(b"".join(orjson.dumps(line) + b"\n" for line in lines) + torn)


def test_every_number_becomes_a_scalar_once_even_across_a_restart(tmp_path):
    _append(tmp_path,
            {"kind": "train_step", "step": 1, "reward_mean": 0.25, "groups_discarded_total": {"stale": 2},
             "siblings_dropped_total": {}},
            {"kind": "snapshot", "t": 1.5, "checkpoint_id": "r.snapshot.1.1", "outcome": "published", "reason": "ok",
             "anchor_step": 1, "admission_closed_s": 0.5, "parked_agents": 3, "invariant_broken": False},
            {"kind": "train_step", "step": 2, "reward_mean": 0.5, "groups_discarded_total": {"stale": 3}},
            torn=b'{"kind": "train_step", "step": 3, "rew')
    mirror = TensorBoardMirror(tmp_path)
    assert mirror.mirror_new_lines() == 3
    mirror.close()
    # The torn line is finished, then a restarted run mirrors only what is new.
    _append(tmp_path, {}, torn=b"")
    with (tmp_path / "metrics.jsonl").open("rb+") as f:  # complete the torn line in place, as the writer's retry does
        body = f.read().replace(b'"rew{}\n', b'"reward_mean": 0.75}\n')
        f.seek(0)
        f.truncate()
        f.write(body)
    _append(tmp_path, {"kind": "recovery", "incarnation": 2, "source": {"kind": "snapshot", "step": 1,
                                                                          "reason": "newest"}})
    restarted = TensorBoardMirror(tmp_path)
    assert restarted.mirror_new_lines() == 2
    restarted.close()

    scalars = _scalars(tmp_path)
    assert scalars["train/reward_mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert scalars["train/groups_discarded_total/stale"] == [(1, 2.0), (2, 3.0)]
    assert scalars["snapshot/admission_closed_s"] == [(1, 0.5)] and scalars["snapshot/parked_agents"] == [(1, 3.0)]
    assert "snapshot/invariant_broken" not in scalars and "snapshot/anchor_step" not in scalars
    assert "snapshot/t" not in scalars and "train/step" not in scalars
    texts = Counter(value.tag for event in _events(tmp_path) for value in event.summary.value
                    if not value.HasField("simple_value"))
    assert texts["snapshot/outcome/text_summary"] == 1 and texts["recovery/text_summary"] == 1, texts

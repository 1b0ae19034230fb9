"""Reads back what the W&B mirror wrote: the history rows of an offline run's data file (W&B 0.30 has no Python reader of
its own)."""

import json
from pathlib import Path

BLOCK = 32768
HEADER = 7


def history_points(path: Path) -> list[dict]:
    """Every history row a W&B data file (`run-<id>.wandb`, LevelDB's log format) holds, as {key: value}."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        if kind == 0 and length == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        pending += chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            records.append(pending)
            pending = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows

"""`[metrics] tensorboard = true`: the lines of metrics.jsonl as TensorBoard event files.

A mirror, not a second source: it tails `metrics.jsonl` (every line any part of the run
wrote) and writes each number of each line as a scalar under `<run_dir>/tensorboard/`
(`train/<key>` at the train step; `eval/<key>` at the evaluated step; `snapshot/<key>` at the attempt's anchor
step, with its outcome and reason as text; a restore's source as text). How far it got is kept in
`tensorboard/mirrored_offset` (`controller.stores.metrics_tail`), so a restarted run goes on where the last one stopped
instead of writing every point twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from typing import Protocol

from turnkeep.controller.stores.metrics_tail import MetricsTail, numbers
from turnkeep.schemas.choices import MetricsKind

log = logging.getLogger("turnkeep.metrics")

TENSORBOARD_DIR = "tensorboard"
EVERY_S = 2.0
NOT_SCALARS = {"t", "step", "anchor_step"}
"""Numbers that are the point's own time or step, not a measurement."""


class TensorBoardMirror:
    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter  # only runs that ask for TensorBoard import it

        self._dir = Path(run_dir) / TENSORBOARD_DIR
        self._dir.mkdir(exist_ok=True)
        # Its own file per start: event file names are only unique to the second.
        self._writer = SummaryWriter(logdir=str(self._dir), flush_secs=EVERY_S,
                                     filename_suffix=f".{secrets.token_hex(4)}")
        self._tail = MetricsTail(run_dir, self._dir)

    def mirror_new_lines(self) -> int:
        """Write what was appended since the last call; the number of lines mirrored (a torn last line waits)."""
        records = self._tail.read_new()
        for record in records:
            self._write(record)
        if records:
            self._writer.flush()
        self._tail.commit()
        return len(records)

    def _write(self, record: dict) -> None:
        kind = record.get("kind")
        if kind == MetricsKind.TRAIN_STEP:
            step = int(record.get("step", 0))
            for key, value in numbers(record):
                if key not in NOT_SCALARS:
                    self._writer.add_scalar(f"train/{key}", value, step)
        elif kind == MetricsKind.SNAPSHOT:
            step = int(record.get("anchor_step", 0))
            for key, value in numbers(record):
                if key not in NOT_SCALARS:
                    self._writer.add_scalar(f"snapshot/{key}", value, step)
            self._writer.add_text("snapshot/outcome", f"{record.get('checkpoint_id')}: {record.get('outcome')} "
                                                      f"({record.get('reason')})", step)
        elif kind == MetricsKind.EVAL:
            step = int(record.get("step", 0))
            for key, value in numbers(record):
                if key not in NOT_SCALARS:
                    self._writer.add_scalar(f"eval/{key}", value, step)
        elif kind == MetricsKind.RECOVERY:
            source = record.get("source") or {}
            self._writer.add_text("recovery", f"incarnation {record.get('incarnation')} restored from "
                                              f"{source.get('kind')} (step {source.get('step')}): "
                                              f"{source.get('reason')}", int(source.get("step") or 0))

    def close(self) -> None:
        self.mirror_new_lines()
        self._writer.close()


class Mirror(Protocol):
    def mirror_new_lines(self) -> int: ...

    def close(self) -> None: ...


async def keep_mirroring(mirror: Mirror, every_s: float = EVERY_S) -> None:
    try:
        while True:
            await asyncio.sleep(every_s)
            try:
                mirror.mirror_new_lines()
            except OSError as err:  # a full disk: the next round tries again
                log.warning("could not mirror metrics.jsonl (%s): %s", type(mirror).__name__, err)
    finally:
        mirror.close()

"""Remove the journal that no kept snapshot and no future cut can replay.

Only snapshots need a journal: a trainer checkpoint holds its full state. So after each
trainer checkpoint (and its pruning), what stays is, per incarnation's journal, the
segments from the lowest base that a kept snapshot or the running journal replays from;
an incarnation's journal that nothing names is removed whole. A kill in the middle
leaves more on disk, never less, and the next checkpoint's pruning takes the rest.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import orjson

from turnkeep.controller.journal.state_journal import JOURNAL_DIR, StateJournal
from turnkeep.primitives.segment_reader import prune_before

log = logging.getLogger("turnkeep.journal")
SNAPSHOT_STATES = "checkpoints/step_*/snapshots/*/controller/state.json"


def needed_bases(run_dir: Path) -> dict[str, int]:
    """Journal directory (relative to the run directory) -> the lowest base seq a kept snapshot replays from.

    Snapshots still in their staging directories count too (pathlib's `*` matches their dot names)."""
    needed: dict[str, int] = {}
    for path in Path(run_dir).glob(SNAPSHOT_STATES):
        try:
            ref = orjson.loads(path.read_bytes()).get("journal_ref")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            continue  # a snapshot that cannot be read is never restored, so it needs nothing
        if isinstance(ref, dict) and isinstance(ref.get("journal"), str):
            seq = int((ref.get("base_position") or {}).get("seq", 0))
            needed[ref["journal"]] = min(seq, needed.get(ref["journal"], seq))
    return needed


def prune_journals(run_dir: Path, current: StateJournal) -> list[Path]:
    """Prune; returns what was removed (segments and whole journals)."""
    run_dir = Path(run_dir)
    needed = needed_bases(run_dir)
    current_rel = str(current.directory.relative_to(run_dir))
    needed[current_rel] = min(current.keep_from_seq, needed.get(current_rel, current.keep_from_seq))
    removed: list[Path] = []
    for directory in sorted((run_dir / JOURNAL_DIR).glob("inc-*")):
        rel = str(directory.relative_to(run_dir))
        try:
            if rel not in needed:
                shutil.rmtree(directory)
                removed.append(directory)
            else:
                removed += prune_before(directory, needed[rel])
        except OSError as err:
            log.warning("could not prune the journal %s (%s); it stays on disk until the next checkpoint",
                        directory, err)
    return removed

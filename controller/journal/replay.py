"""A cut's state, rebuilt: its base file plus the journal's records up to its position.

The replayed state must show the counts and digests the cut recorded under its barrier;
anything else (a missing or pruned segment, a record torn in the middle, a journal from
another run, a base that is not the one the cut named) raises `JournalCorrupt` naming
the file and the problem, and the restore falls back to an older source.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from controller.journal.records import ReplayState
from controller.journal.state_journal import BASE_KEY, JournalRef
from primitives.segment_format import JournalCorrupt, LogPosition
from primitives.segment_reader import read_records
from schemas.audit import ids_digest, row_key


def load_base(path: Path) -> tuple[dict, dict | None]:
    """(the full state, its journal marker: None for a state from before journals)."""
    try:
        raw = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        raise JournalCorrupt(f"the base state {path} cannot be read ({err})") from None
    if not isinstance(raw, dict):
        raise JournalCorrupt(f"the base state {path} holds a JSON {type(raw).__name__}, not a controller state")
    marker = raw.pop(BASE_KEY, None)
    return raw, marker


def state_at(run_dir: Path, ref: JournalRef) -> dict:
    base_path = Path(run_dir) / ref.base
    base, marker = load_base(base_path)
    if marker is None or marker.get("log_id") != ref.log_id or marker.get("position") != ref.base_position:
        raise JournalCorrupt(
            f"{base_path} is not the base the cut named (it says {marker}, the cut wants journal {ref.log_id} at "
            f"{ref.base_position}): the file was replaced after the cut")
    replay = ReplayState(base)
    start, end = LogPosition.from_dict(ref.base_position), LogPosition.from_dict(ref.position)
    for payload in read_records(Path(run_dir) / ref.journal, ref.log_id, start, end):
        replay.apply(payload)
    state = replay.state_dict()
    _check(state, ref, Path(run_dir) / ref.journal)
    return state


def _check(state: dict, ref: JournalRef, journal: Path) -> None:
    rows, groups = state["data_plane"]["rows"], state["group_ledger"]["groups"]
    found = (len(rows), ids_digest(row_key(r["group_id"], r["sibling"]) for r in rows), len(groups),
             ids_digest(g["group_id"] for g in groups))
    wanted = (ref.rows, ref.rows_digest, ref.groups, ref.groups_digest)
    if found != wanted:
        raise JournalCorrupt(
            f"replaying {journal} to seq {ref.position.get('seq')} gives {found[0]} rows (digest {found[1]}) and "
            f"{found[2]} groups (digest {found[3]}), the cut recorded {wanted[0]} rows (digest {wanted[1]}) and "
            f"{wanted[2]} groups (digest {wanted[3]}): the journal does not hold what the cut saw")


def resolve_state(run_dir: Path, raw: dict) -> dict:
    """A saved controller state in either form: the full state, or a cut that names its journal position."""
    if "journal_ref" not in raw:
        raw = dict(raw)
        raw.pop(BASE_KEY, None)
        return raw
    state = state_at(run_dir, JournalRef.model_validate(raw["journal_ref"]))
    return {**state, **{k: v for k, v in raw.items() if k != "journal_ref"}}

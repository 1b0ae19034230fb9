"""A cut's state, rebuilt: its base file plus the journal's records up to its position.

The replayed state must show the counts and digests the cut recorded under its barrier;
anything else (a missing or pruned segment, a record torn in the middle, a journal from
another run, a base that is not the one the cut named) raises `JournalCorrupt` naming
the file and the problem, and the restore falls back to an older source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from turnkeep.controller.journal.records import GROUPS_FINISHED, ROWS_DELETED, STEP, TRAINED, ReplayState, encode
from turnkeep.controller.journal.state_journal import BASE_KEY, JOURNAL_DIR, RESTORED_FROM_FILE, START_FILE, JournalRef
from turnkeep.primitives.segment_format import JournalCorrupt, LogPosition
from turnkeep.primitives.segment_reader import read_records, read_records_to_end
from turnkeep.schemas.audit import ids_digest, row_key


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
    return replay_to(run_dir, ref).state_dict()


def replay_to(run_dir: Path, ref: JournalRef) -> ReplayState:
    """The cut's state, checked against what the cut recorded; `roll_past_cut` can carry it on."""
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
    _check(replay.state_dict(), ref, Path(run_dir) / ref.journal)
    return replay


@dataclass
class PastCut:
    """What a restore kept of the journal after its cut."""

    records: int
    lost_steps: list[dict]
    stopped: str | None
    """Why the journal was not read to its last record (damage, a missing segment), or None."""
    journal: str = ""
    """The journal read past the cut (relative to the run directory): the cut's own, or a later restore's."""
    restored_from: dict | None = None
    """What the restoring incarnation's journal records beside its base (`RESTORED_FROM_FILE`): the cut, and the
    newest policy version kept so far."""
    kept_steps: list[dict] = field(default_factory=list)
    """Train steps after the cut kept with the trainer that survived them (`keep_steps`)."""

    @property
    def newest_policy_version(self) -> int:
        """The newest policy version of an undone step kept so far (0: none)."""
        return (self.restored_from or {}).get("newest_policy_version") or 0


def roll_past_cut(run_dir: Path, ref: JournalRef, replay: ReplayState, keep_steps: bool = False) -> PastCut:
    """Apply the records after the cut's position, to the last whole one. Every prefix of the journal is a state
    the controller held, so damage part way keeps what came before it and says so; a torn tail is the normal end
    of a journal whose writer was killed. `keep_steps`: the train steps in them are kept, not undone."""
    replay.past_cut(keep_steps)
    records, stopped = 0, None
    try:
        for payload in read_records_to_end(Path(run_dir) / ref.journal, ref.log_id,
                                           LogPosition.from_dict(ref.position)):
            replay.apply(payload)
            records += 1
    except JournalCorrupt as err:
        stopped = str(err)
    return PastCut(records, list(replay.lost_steps), stopped, kept_steps=list(replay.kept_steps))


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


def resolve_state_past_cut(run_dir: Path, raw: dict, incarnation: int | None = None,
                           keep_steps: bool = False, trained_since: dict | None = None) -> tuple[dict, PastCut | None]:
    """A saved controller state carried on to the end of the journal it was taken from (`roll_past_cut`): a cut
    that names its journal position, or a trainer checkpoint's full state with its base marker. A state from
    before journals has nowhere to go on from: (the state, None).

    When an earlier incarnation already restored this same cut and went on (then died before it saved anything
    newer), its journal starts from that restore and holds everything since: the restore goes on from the newest
    such journal (below `incarnation`, the one restoring now) instead, so no incarnation's work is lost twice.
    `keep_steps`: for the trainer that trained every step of the journal and survived (`ReplayState.past_cut`);
    `trained_since`: that trainer's last step ({"step", "groups"}), which the journal may lack (`step_past_journal`)."""
    if "journal_ref" in raw:
        ref = JournalRef.model_validate(raw["journal_ref"])
        replay = replay_to(run_dir, ref)
        extra = {k: v for k, v in raw.items() if k != "journal_ref"}
    elif isinstance(marker := raw.get(BASE_KEY), dict):
        base = {k: v for k, v in raw.items() if k != BASE_KEY}
        ref = _ref_at(marker["journal"], marker["log_id"], marker["position"])
        replay = ReplayState(base)
        extra = {k: v for k, v in base.items() if k not in ReplayState.KEYS}
    else:
        return resolve_state(run_dir, raw), None
    cut = {"log_id": ref.log_id, "position": ref.position}
    newest_before = None
    if (later := _newest_restore_of(run_dir, cut, incarnation)) is not None:
        start, later_base, marker, newest_before = later
        replay, ref = ReplayState(later_base), _ref_at(str(start.parent.relative_to(run_dir)), marker["log_id"],
                                                       marker["position"])
    past = roll_past_cut(run_dir, ref, replay, keep_steps)
    if keep_steps and trained_since is not None and past.stopped is None and step_past_journal(replay, trained_since):
        past.kept_steps = list(replay.kept_steps)
    past.journal = ref.journal
    newest = max([step["policy_version"] for step in past.lost_steps + past.kept_steps]
                 + ([newest_before] if newest_before else []), default=None)
    past.restored_from = {**cut, "newest_policy_version": newest}
    # The replayed keys last: a snapshot's own `step` is its cut's, and a kept trainer's step is later.
    return {**extra, **replay.state_dict()}, past


def step_past_journal(replay: ReplayState, step: dict) -> bool:
    """Apply a train step the trainer took and the journal never recorded (its controller died between the
    trainer's answer and the journal's flush), as the train pump would have: when it is the journal's next step and
    every group it trained still has its rows. False: it is not, nothing applied."""
    groups = list(step["groups"])
    if int(step["step"]) != replay.step + 1 or not groups or any(not replay.rows.get(g) for g in groups):
        return False
    for kind, value in ((TRAINED, {"step": step["step"], "policy_version": step["step"], "groups": groups}),
                        (ROWS_DELETED, groups), (GROUPS_FINISHED, groups), (STEP, step["step"])):
        replay.apply(encode(kind, value))
    return True


def _ref_at(journal: str, log_id: str, position: dict) -> JournalRef:
    """A reference to a bare journal position (no counts to check: reading on from it checks the chain)."""
    return JournalRef(journal=journal, log_id=log_id, base="", base_position=position, position=position, rows=0,
                      rows_digest="", groups=0, groups_digest="")


def _newest_restore_of(run_dir: Path, cut: dict, incarnation: int | None) -> tuple[Path, dict, dict, int | None] | None:
    """(start file, its state, its journal marker, the newest policy version kept by then) of the newest journal
    whose base is a restore of `cut`, or None. One that cannot be read is passed over: the restore then keeps
    less, never a damaged state."""
    found = []
    for path in Path(run_dir).glob(f"{JOURNAL_DIR}/inc-*/{RESTORED_FROM_FILE}"):
        number = int(path.parent.name.removeprefix("inc-"))
        if incarnation is not None and number >= incarnation:
            continue
        try:
            restored_from = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(restored_from, dict) and {k: restored_from.get(k) for k in cut} == cut:
            found.append((number, path.parent / START_FILE, restored_from.get("newest_policy_version")))
    for _, start, newest in sorted(found, reverse=True):
        try:
            base = orjson.loads(start.read_bytes())
            marker = base.pop(BASE_KEY)
        except (OSError, orjson.JSONDecodeError, KeyError, AttributeError):
            continue
        return start, base, marker, newest
    return None


def resolve_state(run_dir: Path, raw: dict) -> dict:
    """A saved controller state in either form: the full state, or a cut that names its journal position."""
    if "journal_ref" not in raw:
        raw = dict(raw)
        raw.pop(BASE_KEY, None)
        return raw
    state = state_at(run_dir, JournalRef.model_validate(raw["journal_ref"]))
    return {**state, **{k: v for k, v in raw.items() if k != "journal_ref"}}

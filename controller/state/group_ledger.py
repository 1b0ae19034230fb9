"""Every admitted prompt group that is not yet trained or discarded, sibling by sibling.

This is the recovery ledger's seed: it knows each unfinished group's problem, which
siblings are sealed and how many attempts each one used, so retries, drops and (later)
restores all read one record.

Every change to a group is journaled as the group's whole entry (a few siblings), and a
finished group as its id, so a replay upserts entries in the order they changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from turnkeep.controller.journal.records import GROUP, GROUPS_FINISHED
from turnkeep.controller.journal.state_journal import NO_JOURNAL, JournalHooks
from turnkeep.schemas.audit import IdsDigest
from turnkeep.schemas.rollout import Problem


class SiblingState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SEALED = "sealed"
    DROPPED = "dropped"


@dataclass
class SiblingEntry:
    state: SiblingState = SiblingState.PENDING
    attempts: int = 0
    last_reason: str = ""
    restarts: int = 0
    """Attempts cut short by a crash; they do not count against `rollout.max_attempts`."""
    incarnation: int = 0
    """The controller incarnation that started the current attempt (its turn journal records carry it)."""
    cut_short: bool = False
    """The current attempt was running at a crash and no attempt has started since: a later restore may still
    continue it from its journaled boundary, even when the incarnation that reopened it died before running it."""

    def as_dict(self) -> dict:
        # Written out: `dataclasses.asdict` deep-copies field by field, and every ledger change journals a whole
        # group (it was most of the pumps' ledger time, and of `bench scaling`'s state building).
        return {"state": self.state, "attempts": self.attempts, "last_reason": self.last_reason,
                "restarts": self.restarts, "incarnation": self.incarnation, "cut_short": self.cut_short}


@dataclass
class GroupEntry:
    group_id: str
    problem: Problem
    siblings: list[SiblingEntry] = field(default_factory=list)
    complete: bool = False
    round: int = 0
    """Whole-group reruns so far; a sibling task of an earlier round is stale and must change nothing."""
    scored: bool = False
    """A group-scored environment's rewards were applied to every row."""
    abandoned: list[str] = field(default_factory=list)
    """Rollouts a whole-group rerun abandoned while they ran: a snapshot taken meanwhile may hold one
    of them parked, and it must never be continued."""

    def settled(self) -> bool:
        return all(s.state in (SiblingState.SEALED, SiblingState.DROPPED) for s in self.siblings)

    def sealed(self) -> int:
        return sum(s.state == SiblingState.SEALED for s in self.siblings)


class GroupLedger:
    def __init__(self, min_sealed: int = 2, journal: JournalHooks = NO_JOURNAL) -> None:
        self._groups: dict[str, GroupEntry] = {}
        # Kept as groups come and go, so a cut (under the data-plane barrier) reads them without visiting every group.
        self._digest = IdsDigest()
        self._with_running: dict[str, None] = {}
        """Groups with a running sibling, in the order they got one."""
        self._min_sealed = min_sealed
        self.journal = journal
        self.incarnation = 0
        """This controller's incarnation, stamped on every attempt it starts (`Controller.start_journal`)."""


    def begin_incarnation(self, incarnation: int) -> None:
        """Stamp every attempt started from now on with this controller's incarnation."""
        self.incarnation = incarnation

    def _changed(self, group_id: str) -> None:
        group = self._groups[group_id]
        self._index_running(group)
        self.journal.record(GROUP, self._entry_dict(group))

    def _index_running(self, group: GroupEntry) -> None:
        if SiblingState.RUNNING in [s.state for s in group.siblings]:
            self._with_running.setdefault(group.group_id)
        else:
            self._with_running.pop(group.group_id, None)

    def admit(self, group_id: str, problem: Problem, group_size: int) -> None:
        if group_id not in self._groups:
            self._digest.add(group_id)
        self._groups[group_id] = GroupEntry(group_id, problem, [SiblingEntry() for _ in range(group_size)])
        self._changed(group_id)

    def start_attempt(self, group_id: str, sibling: int) -> int:
        entry = self._groups[group_id].siblings[sibling]
        entry.state = SiblingState.RUNNING
        entry.incarnation = self.incarnation
        entry.cut_short = False
        attempt = entry.attempts
        entry.attempts += 1
        self._changed(group_id)
        return attempt

    def seal(self, group_id: str, sibling: int) -> None:
        entry = self._groups[group_id].siblings[sibling]
        entry.state, entry.cut_short = SiblingState.SEALED, False
        self._changed(group_id)

    def fail(self, group_id: str, sibling: int, reason: str, max_attempts: int) -> bool:
        """Record a failed attempt; True when the sibling may be tried again."""
        entry = self._groups[group_id].siblings[sibling]
        entry.last_reason = reason
        entry.cut_short = False
        retry = entry.attempts - entry.restarts < max_attempts
        entry.state = SiblingState.PENDING if retry else SiblingState.DROPPED
        self._changed(group_id)
        return retry

    def interrupt(self, group_id: str, sibling: int, reason: str) -> None:
        """An attempt cut off from outside (its environment server went away): pending again, and, like an attempt
        cut short by a crash, not counted against `rollout.max_attempts`."""
        entry = self._groups[group_id].siblings[sibling]
        entry.last_reason = reason
        entry.restarts += 1
        entry.cut_short = False
        entry.state = SiblingState.PENDING
        self._changed(group_id)

    def settle(self, group_id: str, need_all: bool = False) -> bool | None:
        """None while siblings still run; True when trainable; False when too few sealed.

        `need_all`: every sibling must be sealed (a group-scored environment scores exactly its group);
        such a group is complete, and so offered to the trainer, only once `mark_scored` applied its rewards.
        """
        group = self._groups[group_id]
        if not group.settled():
            return None
        if need_all:
            trainable = group.sealed() == len(group.siblings)
            group.complete = trainable and group.scored
        else:
            trainable = group.complete = group.sealed() >= self._min_sealed
        self._changed(group_id)
        return trainable

    def round(self, group_id: str) -> int | None:
        """The group's current round (None once it is trained or discarded)."""
        group = self._groups.get(group_id)
        return None if group is None else group.round

    def running_siblings(self) -> list[tuple[str, int]]:
        """(group id, sibling) of every running sibling; visits only the groups that have one."""
        return [(gid, i) for gid in self._with_running for i, s in enumerate(self._groups[gid].siblings)
                if s.state is SiblingState.RUNNING]

    def running_rollouts(self, group_id: str) -> list[str]:
        return list(self.running_attempts(group_id))

    def running_attempts(self, group_id: str) -> dict[str, int]:
        """Each running sibling's current attempt (its rollout id) -> the incarnation that started it."""
        group = self._groups[group_id]
        return {f"{group_id}.{i}.{s.attempts - 1}": s.incarnation for i, s in enumerate(group.siblings)
                if s.state is SiblingState.RUNNING}

    def continuable_attempts(self, group_id: str) -> dict[str, int]:
        """Each sibling's current attempt that a restore may continue -> the incarnation that started it: the
        running ones, and those a crash cut short that no later incarnation started again."""
        group = self._groups[group_id]
        return {f"{group_id}.{i}.{s.attempts - 1}": s.incarnation for i, s in enumerate(group.siblings)
                if s.state is SiblingState.RUNNING or (s.state is SiblingState.PENDING and s.cut_short)}

    def restart_group(self, group_id: str) -> list[int]:
        """Start the whole group over as a new round; returns the sealed siblings this discards.

        Attempt numbers keep counting, so a row of an earlier round never matches a sibling again.
        """
        group = self._groups[group_id]
        discarded = [i for i, s in enumerate(group.siblings) if s.state is SiblingState.SEALED]
        group.abandoned += self.running_rollouts(group_id)
        group.round += 1
        group.complete = group.scored = False
        for entry in group.siblings:
            entry.state, entry.cut_short = SiblingState.PENDING, False
        self._changed(group_id)
        return discarded

    def drop_group(self, group_id: str, reason: str) -> None:
        """Give the whole group up; a new round, so its sibling tasks still running change nothing."""
        group = self._groups[group_id]
        group.abandoned += self.running_rollouts(group_id)
        group.round += 1
        for entry in group.siblings:
            entry.state, entry.cut_short = SiblingState.DROPPED, False
            entry.last_reason = reason
        self._changed(group_id)

    def abandoned(self, group_id: str) -> set[str]:
        group = self._groups.get(group_id)
        return set(group.abandoned) if group is not None else set()

    def mark_scored(self, group_id: str) -> None:
        group = self._groups[group_id]
        group.scored = group.complete = True
        self._changed(group_id)

    def scored(self, group_id: str) -> bool:
        return self._groups[group_id].scored

    def started_any(self, group_id: str) -> bool:
        """Some sibling of the group ran or sealed (so a whole-group rerun throws work away)."""
        return any(s.attempts > 0 for s in self._groups[group_id].siblings)

    def sibling(self, group_id: str, sibling: int) -> SiblingEntry | None:
        group = self._groups.get(group_id)
        if group is None or not 0 <= sibling < len(group.siblings):
            return None
        return group.siblings[sibling]

    def reopen_after_restore(self) -> tuple[list[tuple[str, int]], list[str]]:
        """After a restore: every running sibling's attempt was cut short by the crash.

        Returns (siblings to run again, groups already settled); a restored sibling's
        next attempt is numbered after the saved one, so attempt N continues as N+1.
        """
        to_run, settled = [], []
        for group in self._groups.values():
            for index, entry in enumerate(group.siblings):
                if entry.state is SiblingState.RUNNING:
                    entry.restarts += 1
                    entry.state, entry.cut_short = SiblingState.PENDING, True
                if entry.state is SiblingState.PENDING:
                    to_run.append((group.group_id, index))
            self._changed(group.group_id)
            if group.settled():
                settled.append(group.group_id)
        return to_run, settled

    def problem(self, group_id: str) -> Problem:
        return self._groups[group_id].problem

    def finish(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            if self._groups.pop(group_id, None) is not None:
                self._digest.remove(group_id)
                self._with_running.pop(group_id, None)
        self.journal.record(GROUPS_FINISHED, list(group_ids))

    def inflight(self) -> int:
        return len(self._groups)

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def complete_group_ids(self) -> list[str]:
        return [gid for gid, group in self._groups.items() if group.complete]

    def groups_digest(self) -> str:
        """`ids_digest` of every group id, kept as groups come and go."""
        return self._digest.hexdigest()

    @staticmethod
    def _entry_dict(g: GroupEntry) -> dict:
        return {
            "group_id": g.group_id,
            "problem": g.problem.model_dump(),
            "complete": g.complete,
            "round": g.round,
            "scored": g.scored,
            "abandoned": list(g.abandoned),
            "siblings": [s.as_dict() for s in g.siblings],
        }

    def state_dict(self) -> dict:
        return {"groups": [self._entry_dict(g) for g in self._groups.values()]}

    def load_state_dict(self, state: dict) -> None:
        self._groups.clear()
        self._digest, self._with_running = IdsDigest(), {}
        for raw in state["groups"]:
            siblings = [
                SiblingEntry(SiblingState(s["state"]), s["attempts"], s["last_reason"], s.get("restarts", 0),
                             s.get("incarnation", 0), s.get("cut_short", False))
                for s in raw["siblings"]
            ]
            problem = Problem.model_validate(raw["problem"])
            group = GroupEntry(
                raw["group_id"], problem, siblings, raw["complete"], raw.get("round", 0), raw.get("scored", False),
                list(raw.get("abandoned", [])),
            )
            if group.group_id not in self._groups:
                self._digest.add(group.group_id)
            self._groups[group.group_id] = group
            self._index_running(group)

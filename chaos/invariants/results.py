"""What the checks return: one row per check, the run's figures, and the table `turnkeep chaos` prints."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

MAX_LISTED_VIOLATIONS = 20
"""`format()` lists this many violations per check; the rest are counted."""


@dataclass
class InvariantResult:
    number: int
    """The invariant in DESIGN.md; one invariant may have several checks."""
    name: str
    ok: bool
    checked: int
    """How many items the check looked at (see each check for what an item is)."""
    violations: list[str] = field(default_factory=list)
    note: str = ""
    unchecked: bool = False
    """The log lacks the events this check needs (the note says which): ok, but nothing was checked."""


def not_checked(number: int, name: str, missing: str) -> InvariantResult:
    return InvariantResult(number, name, True, 0, note=f"not checked: no {missing} events in this log",
                           unchecked=True)


def joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


@dataclass
class AuditCounts:
    incarnations: int = 0
    restores_by_source: dict[str, int] = field(default_factory=dict)
    steps_trained: int = 0
    """Steps on the final lineage (abandoned branches excluded)."""
    groups_trained: int = 0
    """Groups trained on the final lineage."""
    restores_continuing_agents: int = 0
    """Restores that continued at least one in-flight agent from its saved or journaled turn."""
    restores_owing_agents: int = 0
    """Restores whose killed incarnation had running agents with a turn of the restored lineage in its turn journal
    (`running_agents_continued`): the ones that had something to continue."""
    continuations_restored: int = 0
    continuations_resumed: int = 0
    """Continuations whose attempt N+1 started or committed a turn."""
    continuations_sealed: int = 0
    """Continuations sealed with the saved boundary's prefix."""
    turns_committed: int = 0
    tokens_generated: int = 0
    tokens_regenerated: int = 0
    """Tokens a crash threw away: of turns that a later incarnation committed again, and of turns a kill cut
    mid-generation that no continuation kept."""
    cut_turn_tokens: int = 0
    """Tokens streamed in turns a kill cut mid-generation (counted where turns stream: `env.stream_turns`, or the
    `token` level)."""
    cut_turn_tokens_kept: int = 0
    """Of those, tokens a continuation went on from (the `token` level)."""
    tokens_discarded: dict[str, int] = field(default_factory=dict)
    """By reason: tokens of groups discarded whole (`stale`, `too_few_siblings`) and never trained."""
    restart_to_first_generation_s: dict[int, float | None] = field(default_factory=dict)
    """Per resumed incarnation: seconds from `run_started` to its first committed turn (None: none)."""

    @property
    def tokens_regenerated_share(self) -> float:
        return self.tokens_regenerated / self.tokens_generated if self.tokens_generated else 0.0

    @property
    def median_restart_to_first_generation_s(self) -> float | None:
        seconds = [s for s in self.restart_to_first_generation_s.values() if s is not None]
        return statistics.median(seconds) if seconds else None

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            # JSON keys are strings: incarnation numbers become "2", "3", ...
            "restart_to_first_generation_s": {str(inc): s for inc, s in self.restart_to_first_generation_s.items()},
            "tokens_regenerated_share": self.tokens_regenerated_share,
            "median_restart_to_first_generation_s": self.median_restart_to_first_generation_s,
        }


@dataclass
class Verdict:
    results: list[InvariantResult]
    counts: AuditCounts

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)

    def result(self, number: int, name: str | None = None) -> InvariantResult:
        """The (first) check of invariant `number`, or the one whose name starts with `name`."""
        return next(r for r in self.results if r.number == number and (name is None or r.name.startswith(name)))

    def to_dict(self) -> dict:
        return {"ok": self.ok, "results": [asdict(r) for r in self.results], "counts": self.counts.to_dict()}

    def format(self) -> str:
        lines = [f"{'status':<17} #  {'invariant':<48} {'checked':>8}  result"]
        for r in self.results:
            status = "not checked" if r.unchecked else "ok" if r.ok else "INVARIANT BROKEN"
            outcome = "ok" if r.ok else f"{len(r.violations)} violation{'s' if len(r.violations) != 1 else ''}"
            lines.append(f"{status:<17} {r.number}  {r.name:<48} {r.checked:>8}  {outcome}")
            for violation in r.violations[:MAX_LISTED_VIOLATIONS]:
                lines.append(f"{'':<20}- {violation}")
            if len(r.violations) > MAX_LISTED_VIOLATIONS:
                lines.append(f"{'':<20}- ... and {len(r.violations) - MAX_LISTED_VIOLATIONS} more")
            if r.note:
                lines.append(f"{'':<20}note: {r.note}")
        c = self.counts
        sources = ", ".join(f"{kind} {n}" for kind, n in sorted(c.restores_by_source.items())) or "none"
        median = c.median_restart_to_first_generation_s
        lines += [
            "",
            f"incarnations {c.incarnations}; restores: {sources}; {c.restores_continuing_agents} of them continued "
            f"in-flight agents; {c.restores_owing_agents} had running agents with a journaled turn to continue",
            f"final lineage: {c.steps_trained} steps, {c.groups_trained} groups trained",
            f"continuations: {c.continuations_restored} restored, {c.continuations_resumed} resumed, "
            f"{c.continuations_sealed} sealed on their saved prefix",
            f"turns committed {c.turns_committed}; tokens generated {c.tokens_generated}, regenerated "
            f"{c.tokens_regenerated} ({c.tokens_regenerated_share:.2%}); turns cut by kills: {c.cut_turn_tokens} "
            f"tokens streamed, {c.cut_turn_tokens_kept} kept",
            "restart -> first generation: "
            + (f"median {median:.1f}s over {sum(s is not None for s in c.restart_to_first_generation_s.values())}"
               f" restarts" if median is not None else "no restart generated a turn"),
        ]
        return "\n".join(lines)

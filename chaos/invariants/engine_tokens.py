"""What the kills cost, counted from the engines' own token tallies (`primitives.token_tally`), to the last token.

The audit sees a cut turn only up to its last progress report (every `env.journal_partial_tokens` or
`journal_partial_s`, and not at all when turns are not streamed). Each engine also counts every token it generated
for each run incarnation, in a file a kill cannot take. Per incarnation, what the engines generated (less their
probes) and no committed turn holds is

    unkept = engine tokens - tokens of committed turns (new ones: less what a continuation carried)
             - streamed tokens of turns settled without a commit (sealed, failed, given up)

For an incarnation that was killed, `unkept` is what the kill cut, to the last token; less what a continuation
kept (the `token` level), it was generated again. For one that ended, it is what its end cancelled and what the
audit could not see of its settled turns: the same count's floor, reported beside it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from turnkeep.chaos.invariants.figures import streamed_by_incarnation
from turnkeep.chaos.invariants.results import AuditCounts
from turnkeep.primitives.token_tally import read_tally, tally_dir
from turnkeep.schemas.audit import RunEnded, TurnCommitted


def read_tallies(run_dir: Path) -> dict[int, int]:
    """Per run incarnation, the tokens every engine generated for it less their probes' (empty: no tally files)."""
    folder = tally_dir(run_dir)
    tallies: dict[int, int] = defaultdict(int)
    for path in sorted(folder.glob("inc*-engine*-pid*.tally")) if folder.is_dir() else []:
        try:
            counts = read_tally(path)
            incarnation = int(path.name.split("-", 1)[0].removeprefix("inc"))
        except (OSError, ValueError):
            continue
        tallies[incarnation] += max(0, counts["generated"] - counts["probes"])
    return dict(tallies)


def fill_engine_counts(events: list, tallies: dict[int, int], counts: AuditCounts) -> None:
    """The engine-counted figures; with tallies, `tokens_generated` and `tokens_regenerated` come from them."""
    if not tallies:
        return
    ended = {e.inc for e in events if isinstance(e, RunEnded)}
    committed: dict[int, int] = defaultdict(int)
    for e in events:
        if isinstance(e, TurnCommitted):
            committed[e.inc] += e.tokens - e.carried
    streamed = streamed_by_incarnation(events)
    unkept: dict[int, int] = {}
    for inc, tokens in tallies.items():
        settled_streamed = streamed[inc].uncommitted - streamed[inc].cut if inc in streamed else 0
        unkept[inc] = tokens - committed.get(inc, 0) - settled_streamed
    counts.engine_tokens_generated = sum(tallies.values())
    counts.engine_unkept_by_incarnation = dict(sorted(unkept.items()))
    killed = [inc for inc in unkept if inc not in ended]
    counts.engine_cut_tokens = sum(max(0, unkept[inc]) for inc in killed)
    kept = sum(streamed[inc].kept for inc in killed if inc in streamed)
    counts.engine_unkept_at_ends = sum(max(0, unkept[inc]) for inc in unkept if inc in ended)
    counts.tokens_generated = counts.engine_tokens_generated
    counts.tokens_regenerated = (counts.tokens_regenerated - counts.cut_turn_tokens + counts.cut_turn_tokens_kept
                                 + max(0, counts.engine_cut_tokens - kept))

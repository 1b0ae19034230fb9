"""The kills' cost by the engines' own count: per incarnation, the tokens the engines generated that no committed
turn holds; a killed incarnation's count includes what streamed after the turn's last progress report."""

from pathlib import Path

from tests.chaos.invariants.history import PARTIAL_TOKENS, healthy_with_a_journal_restore
from turnkeep.chaos.invariants.engine_tokens import read_tallies
from turnkeep.chaos.verdict import check_invariants
from turnkeep.primitives.token_tally import GENERATED, PROBES, TokenTally, read_tally
from turnkeep.schemas.audit import Restored, RunEnded, TurnCommitted

UNSEEN_TAIL = 7
"""Tokens the killed turn streamed after its last progress report: only the engines saw them."""


def _killed_mid_turn() -> list:
    """Incarnation 3 killed (no `run_ended`) while g5.0.0 streamed its second turn; incarnation 4 continues it from
    every journaled token."""
    return [e for e in healthy_with_a_journal_restore() if not (isinstance(e, RunEnded) and e.inc == 3)]


def _committed(events: list, inc: int) -> int:
    return sum(e.tokens - e.carried for e in events if isinstance(e, TurnCommitted) and e.inc == inc)


def test_a_killed_incarnation_owes_what_its_engines_generated_beyond_its_committed_turns():
    events = _killed_mid_turn()
    incarnations = sorted({e.inc for e in events})
    tallies = {inc: _committed(events, inc) for inc in incarnations}
    tallies[3] += PARTIAL_TOKENS + UNSEEN_TAIL  # the cut turn: what its reports saw, and the tail after them
    counts = check_invariants(events, engine_tallies=tallies).counts
    assert counts.cut_turn_tokens == PARTIAL_TOKENS  # the audit's reports see only what they reported
    assert counts.engine_cut_tokens == PARTIAL_TOKENS + UNSEEN_TAIL
    assert counts.engine_unkept_by_incarnation[3] == PARTIAL_TOKENS + UNSEEN_TAIL
    assert counts.engine_tokens_generated == sum(tallies.values()) == counts.tokens_generated
    # The continuation kept the journaled tokens; the unseen tail is generated again.
    without = check_invariants(events).counts
    assert counts.tokens_regenerated - without.tokens_regenerated == UNSEEN_TAIL
    assert counts.engine_unkept_at_ends == 0


def test_without_the_continuation_every_cut_token_is_generated_again():
    events = [e.model_copy(update={"continuations": []}) if isinstance(e, Restored) and e.inc == 4 else e
              for e in _killed_mid_turn()]
    tallies = {inc: _committed(events, inc) for inc in sorted({e.inc for e in events})}
    tallies[3] += PARTIAL_TOKENS + UNSEEN_TAIL
    counts = check_invariants(events, engine_tallies=tallies).counts
    assert counts.tokens_regenerated - check_invariants(events).counts.tokens_regenerated == UNSEEN_TAIL
    assert counts.engine_cut_tokens == PARTIAL_TOKENS + UNSEEN_TAIL


def test_tally_files_are_read_per_incarnation_less_their_probes(tmp_path: Path):
    folder = tmp_path / "engines" / "tokens"
    first, second, later = TokenTally(), TokenTally(), TokenTally()
    first.start(folder, 1, 0)
    second.start(folder, 1, 1).rename(folder / "inc1-engine1-pid999999.tally")  # another engine process
    first.add(GENERATED, 40)
    first.add(PROBES, 3)
    later_path = later.start(folder, 2, 0)
    later.add(GENERATED, 5)
    assert read_tally(later_path) == {"generated": 5, "probes": 0}
    assert read_tallies(tmp_path) == {1: 37, 2: 5}
    assert read_tallies(tmp_path / "nothing") == {}

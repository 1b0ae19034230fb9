"""Invariant 2 at the `token` level: a restore that continues a cut turn keeps every token its turn journal
made durable; one that generates any of them again breaks it (a rolled-back policy's tokens it may drop)."""

from tests.chaos.invariants.history import PARTIAL_TOKENS, broken, healthy, healthy_with_a_journal_restore
from turnkeep.chaos.invariants.partial_turns import NAME
from turnkeep.chaos.verdict import check_invariants
from turnkeep.schemas.audit import Restored, RunEnded, TurnTokens


def _continued_with(partial_tokens: int) -> list:
    return [e.model_copy(update={"continuations": [c.model_copy(update={"partial_tokens": partial_tokens})
                                                   for c in e.continuations]}) if isinstance(e, Restored) and e.inc == 4
            else e for e in healthy_with_a_journal_restore()]


def test_a_cut_turn_continued_from_all_its_durable_tokens_passes():
    result = check_invariants(healthy_with_a_journal_restore()).result(2, NAME)
    assert result.ok and result.checked == 1 and result.note == f"{PARTIAL_TOKENS} journaled tokens of cut turns kept"


def test_a_restore_that_generates_durable_tokens_again_breaks_it():
    assert broken(check_invariants(_continued_with(2)), 2, NAME) == [
        f"g0000005.0.1 continues g0000005.0.0 after turn 1 with 2 tokens of its cut turn, but {PARTIAL_TOKENS} were "
        f"durable in the turn journal (incarnation 4 generates {PARTIAL_TOKENS - 2} of them again)"
    ]


def test_tokens_of_a_policy_the_restore_rolled_back_are_not_owed():
    events = [e.model_copy(update={"policy_version": 5}) if isinstance(e, TurnTokens) else e
              for e in _continued_with(0)]
    result = check_invariants(events).result(2, NAME)
    assert result.ok and result.checked == 0


def test_a_log_without_partial_turns_says_so():
    result = check_invariants(healthy()).result(2, NAME)
    assert result.ok and result.checked == 0 and "the level is not 'token'" in result.note


def _killed_mid_turn(partial_tokens: int) -> list:
    """Incarnation 3 killed (no `run_ended`) while g5.0.0 streamed its second turn."""
    return [e for e in _continued_with(partial_tokens) if not (isinstance(e, RunEnded) and e.inc == 3)]


def test_tokens_of_a_cut_turn_count_as_generated_again_unless_a_continuation_kept_them():
    whole = check_invariants(_killed_mid_turn(PARTIAL_TOKENS)).counts
    assert (whole.cut_turn_tokens, whole.cut_turn_tokens_kept) == (PARTIAL_TOKENS, PARTIAL_TOKENS)
    part = check_invariants(_killed_mid_turn(2)).counts
    assert (part.cut_turn_tokens, part.cut_turn_tokens_kept) == (PARTIAL_TOKENS, 2)
    assert part.tokens_regenerated - whole.tokens_regenerated == PARTIAL_TOKENS - 2
    assert part.tokens_generated == whole.tokens_generated
    # A turn its incarnation went on to commit, or an incarnation that ended cleanly, cut nothing.
    assert check_invariants(_continued_with(PARTIAL_TOKENS)).counts.cut_turn_tokens == 0


def test_a_turn_whose_row_the_next_restore_holds_was_not_cut_whatever_the_audit_lost():
    """The kill took the audit log's last lines (the turn's commit, the sibling's seal) but not the state journal's:
    the restore holds the attempt's row, so its turn finished and nothing of it is generated again."""
    from turnkeep.schemas.audit import RowRef

    def holding_the_row(e):
        if isinstance(e, Restored) and e.inc == 4:
            return e.model_copy(update={"rows": [*e.rows, RowRef(group_id="g0000005", sibling=0, rollout_id="g0000005.0.0")],
                                        "continuations": []})
        return e

    events = [holding_the_row(e) for e in _killed_mid_turn(PARTIAL_TOKENS)]
    counts = check_invariants(events).counts
    assert (counts.cut_turn_tokens, counts.cut_turn_tokens_kept) == (0, 0)

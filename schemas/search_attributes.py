"""Search attributes that make the Temporal UI's workflow list tell what happened."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

RUN_ID = SearchAttributeKey.for_keyword("TurnkeepRunId")
ANCHOR_STEP = SearchAttributeKey.for_int("TurnkeepAnchorStep")
TRIGGER = SearchAttributeKey.for_keyword("TurnkeepTrigger")
OUTCOME = SearchAttributeKey.for_keyword("TurnkeepOutcome")
PARKED_AGENTS = SearchAttributeKey.for_int("TurnkeepParkedAgents")
"""Agents a snapshot attempt saved at their turn boundary (set when it ends)."""
CLOSED_S = SearchAttributeKey.for_float("TurnkeepClosedSeconds")
"""Seconds the attempt kept admission closed (set when it ends)."""
RESTORE_SOURCE = SearchAttributeKey.for_keyword("TurnkeepRestoreSource")
"""A recovery's source: snapshot, trainer_checkpoint, fresh, or superseded."""

ALL = (RUN_ID, ANCHOR_STEP, TRIGGER, OUTCOME, PARKED_AGENTS, CLOSED_S, RESTORE_SOURCE)

TYPE_NAMES = {"KEYWORD": "Keyword", "INT": "Int", "DOUBLE": "Double"}
"""How the `temporal` CLI names each type (`--search-attribute Name=Type`)."""


def described() -> str:
    """Every attribute with its type, for a message that tells how to add them by hand."""
    return ", ".join(f"{key.name}: {TYPE_NAMES[key.indexed_value_type.name]}" for key in ALL)

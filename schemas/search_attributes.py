"""Search attributes that make the Temporal UI's workflow list tell what happened."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

RUN_ID = SearchAttributeKey.for_keyword("TurnkeepRunId")
ANCHOR_STEP = SearchAttributeKey.for_int("TurnkeepAnchorStep")
TRIGGER = SearchAttributeKey.for_keyword("TurnkeepTrigger")
OUTCOME = SearchAttributeKey.for_keyword("TurnkeepOutcome")

ALL = (RUN_ID, ANCHOR_STEP, TRIGGER, OUTCOME)

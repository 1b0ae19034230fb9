"""The vLLM stat logger that counts an engine's generated tokens into its `primitives.token_tally.TokenTally`:
vLLM's documented way to see every engine step, its `stat_loggers` (so the count needs no request of its own)."""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from turnkeep.primitives.token_tally import GENERATED, TokenTally


class TallyingStatLogger(StatLoggerBase):
    """A vLLM stat logger that adds each engine step's generated tokens to a `TokenTally`."""

    def __init__(self, tally: TokenTally) -> None:
        self._tally = tally

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if iteration_stats is not None:
            self._tally.add(GENERATED, iteration_stats.num_generation_tokens)

    def log_engine_initialized(self) -> None:
        pass


def stat_logger_factory(tally: TokenTally):
    """What `AsyncLLM(stat_loggers=[...])` takes: one logger per engine core, each adding to `tally`."""
    return lambda vllm_config, engine_index=0: TallyingStatLogger(tally)

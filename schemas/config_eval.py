"""The `[eval]` table: held-out evaluation during a run, on the run's own engines and environment servers."""

from __future__ import annotations

from pydantic import Field

from turnkeep.schemas.config_base import ConfigPath, StrictModel


class EvalConfig(StrictModel):
    every_steps: int = Field(default=0, ge=0)
    """Evaluate after every this many train steps (0: only when asked, by `turnkeep eval --run-dir D` or the run
    workflow's `evaluate_now` signal). Training goes on meanwhile."""
    before_training: bool = False
    """Also evaluate the starting weights, before the first train step (once per run, not at every restart)."""
    prompts: ConfigPath | None = None
    """Held-out prompts file (`.jsonl` or `.parquet`, the fields of [data] train). None: the held-out seeds of the
    run's `tool_chat` reasoning-gym tasks."""
    prompts_limit: int = Field(default=50, ge=1)
    """Score the first this many held-out prompts."""
    samples: int = Field(default=4, ge=1)
    """Samples per prompt; pass@k is reported for k = 1, powers of two below it, and `samples` itself."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature of the evaluation's rollouts (0: greedy)."""
    correct_at: float = 1.0
    """A sample counts as correct (for pass@k) when its reward is at least this."""
    engine_share: float = Field(default=0.25, gt=0, le=1)
    """The share of the engines' sequence slots (`policy.engines` x `policy.max_num_seqs`) evaluation rollouts may hold
    at once; training's rollouts keep the rest."""
    max_attempts: int = Field(default=3, ge=1)
    """Tries per sample; a sample that fails them all scores 0 and is counted as failed in the eval line."""

    def concurrency(self, engines: int, max_num_seqs: int) -> int:
        """Evaluation rollouts in flight at once."""
        return max(1, int(self.engine_share * engines * max_num_seqs))

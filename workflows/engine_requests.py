"""What the run workflow's `set_engines` update refuses, checked before the request enters the history."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas.snapshot import MAX_ENGINES


def engines_problem(engines: list[int]) -> str | None:
    """Why `set_engines` refuses `engines`; None when it takes them."""
    if not engines:
        return "no policy engines: a run needs at least one"
    if len(engines) > MAX_ENGINES:
        return f"{len(engines)} policy engines: at most {MAX_ENGINES}"
    twice = sorted({engine for engine in engines if engines.count(engine) > 1})
    if twice:
        return f"policy engines named more than once: {twice}"
    negative = sorted(engine for engine in engines if engine < 0)
    return f"negative policy engine indices: {negative}" if negative else None

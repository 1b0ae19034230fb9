"""How each snapshot phase grows across the A x R grid, as a note sentence and its slopes.

Each phase is fitted along every line of the grid (seconds against A at each R, and
against R at each A) and judged on the line where the other size is smallest, where
that other size's own cost dilutes it least. Fixed costs (an fsync, a log line) flatten
a fit at the small end, so the slope between the two largest sizes of that line is
given too: it is what the next tenfold would cost. Whether a phase grows with a size
is read from the least-squares slope; whether that growth is linear, from the top end.
"""

from __future__ import annotations

from collections.abc import Mapping

from turnkeep.bench.growth_fit import LINEAR_FROM, LINEAR_TO, grows, growth_class, log_log_slope

# What each phase should grow with, and why: a phase that grows with anything else is a finding.
EXPECTED_GROWTH = {
    "prepare": ({"A"}, "it counts and checks every parked agent"),
    "commit": ({"A"}, "it writes one line per parked agent"),
    "cut": ({"A"}, "it checks every continuation; the rows are a journal position, never copied"),
    "barrier": ({"A"}, "only the continuation check and the position happen under it"),
    "publish": ({"A"}, "it digests and fsyncs the agents file; the controller's state holds no rows"),
}
PHASE_LABELS = {
    "prepare": "prepare", "commit": "commit", "cut": "cut (total)", "barrier": "cut under the barrier",
    "publish": "publish",
}
SIZE_WORDS = {"A": "the parked agents", "R": "the data-plane rows"}


def phase_growth(phase: str, seconds: Mapping[tuple[int, int], float], agents: list[int], rows: list[int]
                 ) -> tuple[str, dict]:
    """`seconds[(A, R)]` for every cell of the grid (sizes ascending) -> (sentence, slopes)."""
    label = PHASE_LABELS[phase]
    vs_agents = {r: [seconds[a, r] for a in agents] for r in rows} if len(agents) > 1 else {}
    vs_rows = {a: [seconds[a, r] for r in rows] for a in agents} if len(rows) > 1 else {}
    fits = {"A": _fit("A", agents, vs_agents, "R", rows[0]), "R": _fit("R", rows, vs_rows, "A", agents[0])}
    fits = {size: fit for size, fit in fits.items() if fit is not None}
    if not fits:
        return f"{label}: not fitted (the grid has one size of each)", {"verdict": None}
    grown = {size for size, fit in fits.items() if grows(fit["slope"])}
    expected, why = EXPECTED_GROWTH[phase]
    as_expected = grown == expected & set(fits)
    verdict = _verdict(grown, fits)
    parts = [fit["words"] for fit in fits.values()]
    sentence = (f"{label}: {verdict}. {' '.join(parts)} Should grow with {' and '.join(sorted(expected))} ({why}): "
                f"{'as expected' if as_expected else 'NOT as expected'}.")
    data = {"verdict": verdict, "as_expected": as_expected,
            **{f"vs_{size}": {k: v for k, v in fit.items() if k != "words"} for size, fit in fits.items()}}
    return sentence, data


def _fit(size: str, sizes: list[int], lines: dict[int, list[float]], other: str, judged_at: int) -> dict | None:
    if not lines:
        return None
    slopes = {at: log_log_slope(sizes, times) for at, times in lines.items()}
    slope = slopes[judged_at]
    top = log_log_slope(sizes[-2:], lines[judged_at][-2:])
    each = ", ".join(f"{s:.2f} at {other}={at}" for at, s in slopes.items())
    words = f"vs {size}: {growth_class(slope, size)} (least-squares slopes {each})"
    if len(sizes) > 2:
        words += (f", {growth_class(top, size)} at the top end ({top:.2f} from {size}={sizes[-2]} to {sizes[-1]} "
                  f"at {other}={judged_at})")
    words += "."
    return {"slope": slope, "judged_at": judged_at, "top_slope": top,
            "slopes": {str(at): s for at, s in slopes.items()}, "words": words}


def _verdict(grown: set[str], fits: dict[str, dict]) -> str:
    if grown == {"A", "R"}:
        # Each size's own term is linear once it dominates, which the top end shows; the
        # whole-range fit mixes in the other size's cost and reads lower.
        linear = all(LINEAR_FROM <= fit["top_slope"] <= LINEAR_TO for fit in fits.values())
        return "linear in everything" if linear else "grows with both A and R"
    if grown:
        (size,) = grown
        return f"grows only with {size} ({SIZE_WORDS[size]})"
    return "constant"

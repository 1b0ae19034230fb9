"""How a cost grows with a size: the least-squares slope of log(seconds) on log(size), in words.

A slope k means the cost goes like size^k: below 0.2 it hardly moves (constant),
0.7 to 1.3 is linear, anything else is reported as the power itself.
"""

from __future__ import annotations

import math

CONSTANT_BELOW = 0.2
LINEAR_FROM, LINEAR_TO = 0.7, 1.3


def log_log_slope(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(sizes); needs two distinct sizes."""
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError(f"a slope needs two distinct sizes and one time per size, got {sizes} and {seconds}")
    xs = [math.log(s) for s in sizes]
    # A phase too fast for the clock reads 0 s; a nanosecond floor keeps log finite and the slope honest (flat).
    ys = [math.log(max(t, 1e-9)) for t in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def growth_class(slope: float, size_name: str) -> str:
    """`constant`, `linear`, or `~A^k` for another power (k rounded to two digits)."""
    if slope < CONSTANT_BELOW:
        return "constant"
    if LINEAR_FROM <= slope <= LINEAR_TO:
        return "linear"
    return f"~{size_name}^{slope:.2g}"


def grows(slope: float) -> bool:
    return slope >= CONSTANT_BELOW

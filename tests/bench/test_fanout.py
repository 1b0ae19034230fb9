"""`turnkeep bench fanout` runs end to end at a small size and reports what it measured."""

from __future__ import annotations

import argparse

from turnkeep.bench.fanout import run


def test_fanout_follows_the_slowest_server() -> None:
    result = run(argparse.Namespace(servers="1,4", agents=3, slow_s=0.4, repeats=1))
    [one, four] = result.data["rows"]
    assert four["slow_servers"] == 1 and four["one_by_one_s"] >= 0.4
    # Four servers, one slow: all at once costs about the slow one, never the sum of all four phases.
    assert four["fan_out_s"] < four["slowest_alone_s"] + 0.3
    assert "all at once" in result.table

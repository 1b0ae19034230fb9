from turnkeep.bench import journal_cost


def _side(tokens_per_s: float, client: float) -> dict:
    return {"tokens_per_s": tokens_per_s, "client_cpu_per_ktok": client, "front_cpu_per_ktok": 0.02,
            "engine_cpu_per_ktok": 0.06}


def test_the_ratio_is_taken_within_each_pair_and_its_median_reported():
    rounds = [{"turn": _side(1000, 0.001), "token": _side(990, 0.003)},
              {"turn": _side(2000, 0.001), "token": _side(2100, 0.004)},
              {"turn": _side(1000, 0.002), "token": _side(950, 0.003)}]
    table, spread, medians = journal_cost.summary(rounds)
    assert spread == {"median": 0.99, "low": 0.95, "high": 1.05}
    assert medians["token"]["client_cpu_per_ktok"] == 0.003 and medians["turn"]["client_cpu_per_ktok"] == 0.001
    assert "| median (low-high) |  |  | 0.990 (0.950-1.050) | 0.001 / 0.003 |" in table


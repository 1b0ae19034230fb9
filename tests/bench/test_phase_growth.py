from turnkeep.bench.phase_growth import phase_growth

AGENTS = [10, 100, 1000, 10000]
ROWS = [1000, 10000, 100000]


def grid(seconds_of):
    return {(a, r): seconds_of(a, r) for a in AGENTS for r in ROWS}


def test_a_phase_linear_in_agents_only_grows_only_with_a():
    sentence, data = phase_growth("commit", grid(lambda a, r: 1e-5 * a), AGENTS, ROWS)
    assert data["verdict"] == "grows only with A (the parked agents)"
    assert data["as_expected"]
    assert sentence.startswith("commit: grows only with A") and "as expected" in sentence
    assert abs(data["vs_A"]["slope"] - 1.0) < 1e-9 and abs(data["vs_R"]["slope"]) < 1e-9


def test_a_cut_that_copies_the_rows_is_linear_in_everything_and_flagged():
    _, data = phase_growth("cut", grid(lambda a, r: 1e-5 * a + 1e-6 * r), AGENTS, ROWS)
    assert data["verdict"] == "linear in everything"
    assert not data["as_expected"]  # a cut records a journal position: growing with the rows is a regression


def test_a_fixed_cost_flattens_the_fit_but_not_the_top_end_slope():
    _, data = phase_growth("prepare", grid(lambda a, r: 0.01 + 1e-6 * a), AGENTS, ROWS)
    assert data["verdict"] == "constant" and not data["as_expected"]
    assert data["vs_A"]["slope"] < 0.2 < data["vs_A"]["top_slope"]


def test_commit_growing_with_the_rows_is_flagged():
    sentence, data = phase_growth("commit", grid(lambda a, r: 1e-5 * a + 1e-6 * r), AGENTS, ROWS)
    assert not data["as_expected"]
    assert "NOT as expected" in sentence


def test_a_grid_with_one_size_of_each_is_not_fitted():
    sentence, data = phase_growth("publish", {(10, 1000): 0.1}, [10], [1000])
    assert data["verdict"] is None and "not fitted" in sentence

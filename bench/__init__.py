"""`turnkeep bench <name>`: figures, not timed tests. Each module measures one thing and
returns a `BenchResult`; `cli/bench.py` prints its table and writes its JSON."""

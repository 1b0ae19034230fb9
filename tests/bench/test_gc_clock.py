import gc

from turnkeep.bench.gc_clock import GcClock


def test_counts_collections_only_while_entered():
    with GcClock() as clock:
        gc.collect()
        gc.collect()
    assert clock.collections == 2
    assert clock.seconds > 0
    gc.collect()
    assert clock.collections == 2

import gc

from turnkeep.primitives.gc_pause import collector_paused


def test_the_collector_is_off_inside_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()

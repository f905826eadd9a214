"""The garbage-collector pause around a chunk restores whatever state it found."""

from __future__ import annotations

import gc

from qace.engine.gc_pause import collector_paused


def test_pause_restores_the_state_it_found() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the inner block must not re-enable early
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller who disabled it keeps it disabled
    finally:
        gc.enable()


def test_pause_ends_when_the_block_raises() -> None:
    try:
        with collector_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


def test_blocks_in_two_threads_overlapping_keep_it_paused_until_the_last_ends() -> None:
    import threading

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait()
        first_out.set()

    def second() -> None:
        first_in.wait()
        with collector_paused():
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())  # the first thread has left its block: still paused here

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [False]
    assert gc.isenabled()


def test_a_frozen_heap_leaves_later_collections_only_the_objects_made_after() -> None:
    from qace.engine.gc_pause import freeze_heap

    def tracked(x: object) -> bool:  # in a generation collections walk (the permanent one is not)
        return any(y is x for y in gc.get_objects())

    kept = [0]
    assert tracked(kept)
    try:
        freeze_heap()
        made_after = [1]
        assert gc.get_freeze_count() > 0
        assert not tracked(kept) and tracked(made_after)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0 and tracked(kept)

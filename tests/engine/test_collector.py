"""The garbage-collector pause around a chunk restores whatever state it found."""

from __future__ import annotations

import gc

from qace.engine.collector import collector_paused


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

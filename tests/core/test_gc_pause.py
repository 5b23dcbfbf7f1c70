"""``paused_gc``: the cycle collector off inside the block and as it was after it, also on an error."""

from __future__ import annotations

import gc

import pytest

from entropyrl.core.gc_pause import paused_gc


@pytest.fixture(autouse=True)
def _collector_restored():
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_the_collector_is_off_inside_and_back_on_after():
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_turns_it_back_on():
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("set-up failed")
    assert gc.isenabled()


def test_nested_pauses_end_with_the_outermost_and_an_off_collector_stays_off():
    gc.enable()
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()

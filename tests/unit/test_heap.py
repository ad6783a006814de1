"""``infer.heap``: start-up objects leave the collector's scans; later garbage is still
collected."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

import pytest

from infer import heap
from infer.heap import (
    BUSY_COLLECTION_INTERVAL_S,
    IDLE_COLLECTION_INTERVAL_S,
    IdleCollections,
    freeze_heap,
    frozen_heap,
    give_back_memory,
)

pytestmark = pytest.mark.usefixtures("unfrozen_heap")


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_frozen_heap_freezes_what_exists_and_still_collects_new_cycles() -> None:
    survivor = Node()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        assert all(obj is not survivor for obj in gc.get_objects(generation=2))  # frozen
        garbage = _cycle()
        gc.collect()
        assert garbage() is None  # made after the freeze: collected as usual
    assert gc.get_freeze_count() == 0


def test_full_collections_wait_for_the_end_of_a_frozen_heap() -> None:
    before = gc.get_threshold()
    with frozen_heap():
        young, middle, full = gc.get_threshold()
        assert (young, middle) == before[:2]  # young cycles are still collected
        assert full >= 2**30
    assert gc.get_threshold() == before


def test_a_heap_someone_froze_a_little_of_is_still_frozen_for_the_block() -> None:
    """A library had frozen a few objects on the GPU machine; the block freezes the rest."""
    gc.freeze()  # what that library did, before the model's objects existed
    survivor = Node()
    with frozen_heap():
        assert all(obj is not survivor for obj in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0


def test_a_frozen_heap_inside_a_frozen_heap_changes_nothing() -> None:
    """The inner block neither unfreezes the outer one's heap nor lets full collections
    back in. (Not checked by the frozen count: frozen objects that other threads free
    leave it, so it can fall by a few between two reads.)"""
    survivor = Node()
    with frozen_heap():
        held = gc.get_threshold()
        with frozen_heap():
            pass
        assert all(obj is not survivor for obj in gc.get_objects(generation=2))  # still frozen
        assert gc.get_threshold() == held  # full collections still wait
    assert gc.get_freeze_count() == 0
    assert any(obj is survivor for obj in gc.get_objects())  # collectable again


def test_freeze_heap_collects_garbage_first() -> None:
    garbage = _cycle()
    try:
        freeze_heap()
        assert garbage() is None  # not frozen alive: collected before the freeze
    finally:
        gc.unfreeze()


def test_frozen_objects_are_handed_back_at_exit() -> None:
    """A cycle frozen with the heap and dropped later is still freed when the process ends."""
    program = textwrap.dedent(
        """
        from infer.heap import freeze_heap

        class Noisy:
            def __del__(self) -> None:
                print("freed", flush=True)

        a, b = Noisy(), Noisy()
        a.other, b.other = b, a
        freeze_heap()
        del a, b
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["freed", "freed"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_collections_hold_full_collections_until_the_process_is_idle() -> None:
    clock = Clock()
    thresholds = gc.get_threshold()
    with IdleCollections(clock) as collections:
        young, middle, full = gc.get_threshold()
        assert (young, middle) == thresholds[:2] and full > 10**6  # young ones still run
        garbage = _cycle()
        clock.now += IDLE_COLLECTION_INTERVAL_S / 2
        assert not collections.collect_if_due(idle=True)  # the last one was too recent
        clock.now += IDLE_COLLECTION_INTERVAL_S
        assert not collections.collect_if_due(idle=False)  # busy: it waits longer
        assert collections.collect_if_due(idle=True)
        assert garbage() is None
        assert not collections.collect_if_due(idle=True)
    assert gc.get_threshold() == thresholds


def test_under_load_that_never_lets_up_a_full_collection_still_comes() -> None:
    clock = Clock()
    with IdleCollections(clock) as collections:
        clock.now += BUSY_COLLECTION_INTERVAL_S - 1
        assert not collections.collect_if_due(idle=False)
        clock.now += 1
        assert collections.collect_if_due(idle=False)


def test_giving_back_memory_frees_cycles_then_trims_the_allocator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    trims: list[int] = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> None:
            trims.append(pad)

    monkeypatch.setattr(heap, "_glibc", FakeLibc)
    gc.disable()  # the cycle stays until collected
    try:
        ref = weakref.ref(Node())
        assert ref() is not None
        give_back_memory()
        assert ref() is None
    finally:
        gc.enable()
    assert trims == [0]

"""xmesh.backends.derived_cache: values derived once per long-lived array, found by identity."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from xmesh.backends.derived_cache import DerivedCache


def test_a_value_is_made_once_per_objects_and_tag():
    cache, calls = DerivedCache(), []
    a, b = np.arange(4.0), np.arange(4.0)  # equal values, different arrays

    def make(tag, arr):
        return lambda: calls.append((tag, id(arr))) or arr * 2

    first = cache.get((a,), "double", make("double", a))
    assert cache.get((a,), "double", make("double", a)) is first
    assert calls == [("double", id(a))]
    other = cache.get((b,), "double", make("double", b))  # same values, another array: made anew
    assert other is not first and len(calls) == 2
    cache.get((a,), "triple", make("triple", a))  # another tag: made anew
    cache.get((a, None), "double", make("pair", a))  # other objects: made anew
    assert len(calls) == 4 and len(cache) == 4
    np.testing.assert_array_equal(first, a * 2)


def test_an_entry_holds_its_objects_so_their_ids_stay_theirs():
    cache = DerivedCache()

    class Weight:
        pass

    w = Weight()
    ref, key_id = weakref.ref(w), id(w)
    value = cache.get((w,), "t", lambda: "derived")
    del w
    gc.collect()
    assert ref() is not None  # the entry keeps it alive
    assert cache.get((ref(),), "t", lambda: "again") is value and id(ref()) == key_id

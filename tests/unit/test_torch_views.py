"""The torch backend's cache of tensor views: a repeat on the same small tensor gets the same numpy
array (so the team spots the repeat), and a large tensor the program drops is freed."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from pycoll.torch.tensors import Views  # noqa: E402 - after the skip


def test_small_tensors_get_the_same_view_again():
    views = Views()
    t = torch.ones(16)
    assert views.of(t) is views.of(t)
    u = torch.ones(16)
    assert views.of(u) is not views.of(t) and views.of(u) is views.of(u)


def test_large_tensors_are_not_kept_alive():
    views = Views(max_bytes=1 << 10)
    big = torch.ones(1 << 16)
    arr = views.of(big)
    assert arr.size == 1 << 16 and arr.base is not None
    ref = weakref.ref(big)
    del big, arr
    gc.collect()
    assert ref() is None, "the view cache kept a large tensor alive"

"""The regions of team.alloc: which arrays lie in one, and forgetting those whose memory is gone."""

import gc
import mmap

import numpy as np

from pycoll.tl.shm.mapped import Region, address, find


def region(nranks=2, part=8192):
    mm = mmap.mmap(-1, nranks * part)
    view = np.frombuffer(mm, np.uint8)
    return view, Region(mm, address(view), part, nranks, ident=7)


def test_arrays_inside_a_region_are_found_and_others_not():
    view, reg = region()
    regions = [reg]
    inside = view[100:4100].view(np.float32)
    assert find(regions, inside) is reg
    assert find(regions, view[-8:]) is reg  # the last bytes
    assert find(regions, np.zeros(10)) is None  # elsewhere
    assert find(regions, view[::2]) is None  # not contiguous
    assert find(regions, view[:0]) is None  # empty: its address could be anywhere
    other_view, other = region()
    regions.append(other)
    assert find(regions, other_view[8:16]) is other


def test_a_region_whose_memory_is_gone_is_forgotten():
    view, reg = region()
    keep_view, keep = region()
    regions = [reg, keep]
    assert reg.alive
    del view
    gc.collect()
    assert not reg.alive
    assert find(regions, keep_view[:8]) is keep
    assert regions == [keep]

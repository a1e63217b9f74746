"""Torch tensors as pycoll's buffers: flat numpy views of a CPU tensor's memory (:func:`as_numpy`;
:class:`Views` keeps them for tensors called on again, so the team sees a repeat), and a contiguous
copy of the others, written back when the collective finished (:class:`Staged`,
:func:`scatter_copies`). Writes into the caller's tensors happen outside autograd, as gloo's do."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from pycoll.dtypes import DTYPES, to_torch

#: The numpy dtype of each torch dtype pycoll supports.
_NUMPY = {to_torch(n): dt for n, dt in DTYPES.items()}


class _Memory:
    """A contiguous CPU tensor's memory as numpy's array interface, bytes: the array made of it
    keeps the tensor alive (its ``base``). Not ``Tensor.numpy()``, which marks the tensor's storage
    as never to be resized again (``resize_``, an FSDP-style ``untyped_storage().resize_(0)``)."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        self.__array_interface__ = {"data": (t.data_ptr(), False), "shape": (t.numel() * t.element_size(),),
                                    "typestr": "|u1", "version": 3}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a contiguous CPU tensor's memory (no copy); an input with a
    conjugate or negative bit is resolved first (a copy)."""
    if t.device.type != "cpu":
        raise ValueError(f"pycoll backend: tensor on {t.device}; only CPU tensors are supported "
                         "(CUDA memory comes with the cupy transport)")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        raise ValueError(f"pycoll backend: a non-contiguous tensor (strides {t.stride()}) has no flat view")
    dtype = _NUMPY.get(t.dtype)
    if dtype is None:  # (a type pycoll has not: numpy's own reading, or its error)
        return t.numpy().reshape(-1)
    return np.asarray(_Memory(t)).view(dtype)


class Views:
    """The numpy views of the tensors a group's synchronous calls take, kept (the last
    ``limit``) so that a call repeated on the same tensor passes the team the same array: the
    team then recognises the repeat and runs it as a persistent collective (its express lane). A
    view is made again when the tensor's memory, dtype or size changed (``resize_``, ``set_``).
    A view keeps its tensor alive: only tensors up to ``max_bytes`` are kept (a large tensor the
    program drops must give its memory back; its calls gain nothing measurable from the lane)."""

    def __init__(self, limit: int = 32, max_bytes: int = 256 << 10) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._views: Dict[int, tuple] = {}

    def of(self, t: torch.Tensor) -> np.ndarray:
        """A flat numpy view of contiguous CPU tensor ``t`` (the same one as last time, if it
        still describes ``t``'s memory)."""
        entry = self._views.get(id(t))
        ptr = t.data_ptr()
        if entry is not None and entry[0] is t and entry[1] == ptr and entry[2] is t.dtype \
                and entry[3] == t.numel():
            return entry[4]
        arr = as_numpy(t)
        if arr.nbytes > self.max_bytes:
            if entry is not None:
                del self._views[id(t)]
            return arr
        if entry is None and len(self._views) >= self.limit:
            del self._views[next(iter(self._views))]
        self._views[id(t)] = (t, ptr, t.dtype, t.numel(), arr)
        return arr


class Staged:
    """A tensor as a contiguous numpy buffer: its own memory when it is contiguous (its view from
    ``views`` when given), else a contiguous copy that ``finish()`` writes back (for outputs)."""

    __slots__ = ("tensor", "work", "arr", "copied")

    def __init__(self, tensor: torch.Tensor, output: bool = True, views: Optional[Views] = None) -> None:
        self.tensor = tensor
        # (an output whose memory is not its values as they lie: strided, or a conjugate or negated view)
        self.copied = output and not (tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg())
        self.work = tensor.resolve_conj().resolve_neg().contiguous() if self.copied else tensor.contiguous()
        self.arr = views.of(tensor) if views is not None and self.work is tensor else as_numpy(self.work)

    def finish(self) -> None:
        if self.copied:
            with torch.no_grad():  # (a parameter that requires grad is written as gloo writes it)
                self.tensor.copy_(self.work)


def scatter_copies(copies: Sequence[Any]) -> None:
    """Copy each flat buffer's consecutive pieces into the list of tensors it stands for."""
    with torch.no_grad():  # (outputs that require grad are written as gloo writes them)
        for flat, outs in copies:
            off = 0
            for o in outs:
                n = o.numel()
                o.copy_(flat[off:off + n].view(o.shape))
                off += n

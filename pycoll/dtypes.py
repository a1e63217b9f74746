"""The datatypes pycoll supports, in one table: names, numpy dtypes, itemsizes, native codes, torch.

Every other module asks this one: :func:`as_dtype` turns a user's dtype spec (a numpy dtype, a
type, a name such as ``"bfloat16"``) into a supported numpy dtype or raises ``ValueError``;
:data:`DTYPE_CODES` gives each dtype's code in pycoll's C kernels (``PC_INT8``... in
native/pycoll_native.h) and :data:`KINDS` which reductions apply to it; :func:`to_torch` and
:func:`from_torch` map to and from torch dtypes, importing torch only when called (torch is
optional). bfloat16 is ml_dtypes'.

A leaf module: it imports numpy and ml_dtypes, no pycoll module.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

#: (name, native code, kind) of each supported dtype, in the order pycoll lists them. The codes are
#: the enum of native/pycoll_native.h (PC_INT8 = 0 ... PC_BOOL = 14): keep them in sync. The kind
#: says which reductions apply: "int" (signed and unsigned), "float" (float16 and bfloat16
#: included), "complex" or "bool".
_TABLE: Tuple[Tuple[str, int, str], ...] = (
    ("int8", 0, "int"), ("int16", 1, "int"), ("int32", 2, "int"), ("int64", 3, "int"),
    ("uint8", 4, "int"), ("uint16", 5, "int"), ("uint32", 6, "int"), ("uint64", 7, "int"),
    ("float16", 8, "float"), ("float32", 10, "float"), ("float64", 11, "float"),
    ("complex64", 12, "complex"), ("complex128", 13, "complex"), ("bool", 14, "bool"),
    ("bfloat16", 9, "float"),
)

#: canonical name -> numpy dtype of every supported dtype (the name is the dtype's numpy ``.name``).
DTYPES: Dict[str, np.dtype] = {
    name: BFLOAT16 if name == "bfloat16" else np.dtype(name) for name, _, _ in _TABLE
}
#: the supported dtypes' canonical names.
NAMES: Tuple[str, ...] = tuple(DTYPES)
#: numpy dtype -> canonical name.
NAME_OF: Dict[np.dtype, str] = {dt: name for name, dt in DTYPES.items()}
#: numpy dtype -> bytes per element.
ITEMSIZES: Dict[np.dtype, int] = {dt: dt.itemsize for dt in DTYPES.values()}
#: numpy dtype -> code of the dtype in pycoll's native kernels (native/pycoll_native.h).
DTYPE_CODES: Dict[np.dtype, int] = {DTYPES[name]: code for name, code, _ in _TABLE}
#: numpy dtype -> kind ("int", "float", "complex", "bool"): which reductions apply.
KINDS: Dict[np.dtype, str] = {DTYPES[name]: kind for name, _, kind in _TABLE}
#: 2-byte floats, which reductions combine in float32 and round once per step.
HALF: Tuple[np.dtype, np.dtype] = (np.dtype(np.float16), BFLOAT16)

_SUPPORTED = tuple(DTYPES.values())
#: bytes per element -> the code of a native dtype of that size (what moving elements needs).
_SIZED = {1: DTYPE_CODES[DTYPES["uint8"]], 2: DTYPE_CODES[DTYPES["uint16"]], 4: DTYPE_CODES[DTYPES["uint32"]],
          8: DTYPE_CODES[DTYPES["uint64"]], 16: DTYPE_CODES[DTYPES["complex128"]]}


def element_code(dtype: np.dtype) -> Optional[int]:
    """The native code to *move* elements of ``dtype`` with (gather, scatter, alltoall: only the
    size matters): its own, else one of the same size (``long double``: 16 bytes), else None
    (``complex long double``'s 32 bytes, odd-sized records: not on the shared segment)."""
    code = DTYPE_CODES.get(dtype)
    return code if code is not None else _SIZED.get(dtype.itemsize)


def is_supported(dtype: np.dtype) -> bool:
    """Whether the numpy dtype ``dtype`` is one pycoll supports."""
    return dtype in _SUPPORTED


def check_supported(dtype: np.dtype) -> None:
    """Raise ``ValueError`` if pycoll does not support the numpy dtype ``dtype``."""
    if dtype not in _SUPPORTED:
        raise ValueError(f"dtype {dtype} is not supported; supported: {', '.join(NAMES)}")


def as_dtype(dtype: Any) -> np.dtype:
    """A supported numpy dtype from a dtype, a type or a name (``"bfloat16"``); ``ValueError``
    for anything else."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    check_supported(dt)
    return dt


def to_torch(dtype: Any) -> Any:
    """The ``torch.dtype`` of a supported dtype spec (imports torch: ``ImportError`` without it)."""
    import torch  # noqa: PLC0415 - torch is optional: imported when asked for

    return getattr(torch, NAME_OF[as_dtype(dtype)])


def from_torch(dtype: Any) -> np.dtype:
    """The supported numpy dtype of a ``torch.dtype`` (``torch.bfloat16`` -> :data:`BFLOAT16`);
    ``ValueError`` for another torch dtype or anything else."""
    text = str(dtype)
    name = text[len("torch."):]
    if not text.startswith("torch.") or name not in DTYPES:
        raise ValueError(f"torch dtype {dtype} is not supported; supported: {', '.join(NAMES)}")
    return DTYPES[name]

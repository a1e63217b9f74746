"""pycoll.dtypes: the one dtype table, and ops, native and buffers agreeing with it (single process)."""

import sys

import ml_dtypes
import numpy as np
import pytest

from pycoll import buffers, dtypes, ops
from pycoll.ops import ReduceOp

#: the dtypes of the design, in the order of the enum in native/pycoll_native.h.
DESIGN = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64", "complex64", "complex128", "bool"]


def test_the_table_holds_the_dtypes_of_the_design():
    assert sorted(dtypes.DTYPES) == sorted(DESIGN)
    assert dtypes.NAMES == tuple(dtypes.DTYPES)
    assert dtypes.DTYPES["bfloat16"] == np.dtype(ml_dtypes.bfloat16) == dtypes.BFLOAT16
    assert dtypes.HALF == (np.dtype(np.float16), dtypes.BFLOAT16)
    for table in (dtypes.NAME_OF, dtypes.ITEMSIZES, dtypes.DTYPE_CODES, dtypes.KINDS):
        assert list(table) == list(dtypes.DTYPES.values())


@pytest.mark.parametrize("name", DESIGN)
def test_every_dtype_round_trips(name):
    dt = dtypes.DTYPES[name]
    assert isinstance(dt, np.dtype) and dt.name == name
    assert dtypes.NAME_OF[dt] == name
    assert dtypes.as_dtype(name) == dt and dtypes.as_dtype(dt) == dt and dtypes.as_dtype(dt.type) == dt
    assert dtypes.NAME_OF[dtypes.as_dtype(np.zeros(1, dt).dtype)] == name
    assert dtypes.ITEMSIZES[dt] == dt.itemsize == np.zeros(3, dt).nbytes // 3
    assert dtypes.is_supported(dt)
    assert dtypes.KINDS[dt] in ops._VALID


def test_kinds():
    kinds = {name: dtypes.KINDS[dt] for name, dt in dtypes.DTYPES.items()}
    assert {n for n, k in kinds.items() if k == "float"} == {"float16", "bfloat16", "float32", "float64"}
    assert {n for n, k in kinds.items() if k == "complex"} == {"complex64", "complex128"}
    assert {n for n, k in kinds.items() if k == "bool"} == {"bool"}


def test_native_codes_are_unique_and_match_the_c_enum():
    codes = list(dtypes.DTYPE_CODES.values())
    assert sorted(codes) == list(range(len(DESIGN)))  # PC_INT8 = 0 ... PC_BOOL = 14, PC_NDTYPES = 15
    by_code = sorted(dtypes.DTYPE_CODES, key=dtypes.DTYPE_CODES.get)
    assert [dtypes.NAME_OF[dt] for dt in by_code] == DESIGN  # the order of native/pycoll_native.h's enum


@pytest.mark.parametrize("spec", [np.float128 if hasattr(np, "float128") else np.dtype("V3"), "<U1", ">i4",
                                  np.dtype([("a", np.int32)]), object])
def test_as_dtype_rejects_unsupported(spec):
    with pytest.raises(ValueError, match="not supported; supported: int8, int16"):
        dtypes.as_dtype(spec)
    assert not dtypes.is_supported(np.dtype(spec))
    with pytest.raises(ValueError, match="not supported"):
        dtypes.check_supported(np.dtype(spec))


@pytest.mark.parametrize("spec", ["nope", "float8", 3.5])
def test_as_dtype_rejects_unknown(spec):
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes.as_dtype(spec)


@pytest.mark.parametrize("name", DESIGN)
def test_torch_mapping(name):
    torch = pytest.importorskip("torch")
    dt = dtypes.DTYPES[name]
    t = dtypes.to_torch(name)
    assert t is getattr(torch, name) and dtypes.to_torch(dt) is t
    assert dtypes.from_torch(t) == dt
    tensor = torch.zeros(4, dtype=t)
    assert tensor.element_size() == dt.itemsize
    from pycoll.torch.tensors import as_numpy  # noqa: PLC0415 - torch is optional

    arr = as_numpy(tensor)
    assert arr.dtype == dt and arr.size == 4
    arr[1] = 1
    assert tensor[1] == 1  # (a view of the tensor's memory)


def test_from_torch_rejects_what_pycoll_does_not_support():
    torch = pytest.importorskip("torch")
    for bad in (torch.complex32, torch.qint8, "float32", np.float32):
        with pytest.raises(ValueError, match="not supported"):
            dtypes.from_torch(bad)


def test_ops_reexports_the_table():
    assert ops.DTYPES is dtypes.DTYPES
    assert ops.BFLOAT16 is dtypes.BFLOAT16
    assert ops.as_dtype is dtypes.as_dtype
    from pycoll.ops import BFLOAT16, DTYPES, as_dtype  # the names the project imports

    assert (BFLOAT16, DTYPES, as_dtype) == (dtypes.BFLOAT16, dtypes.DTYPES, dtypes.as_dtype)


def test_check_op_follows_the_kinds():
    f32 = np.dtype(np.float32)
    with pytest.raises(ValueError, match="BAND is not defined for float32"):
        ops.check_op(ReduceOp.BAND, f32)
    with pytest.raises(ValueError, match="not supported"):
        ops.check_op(ReduceOp.SUM, np.dtype("<U1"))
    for dt, kind in dtypes.KINDS.items():
        for op in ReduceOp:
            if op in ops._VALID[kind]:
                ops.check_op(op, dt)
            else:
                with pytest.raises(ValueError):
                    ops.check_op(op, dt)
    ops.check_op(ReduceOp.SUM, dtypes.BFLOAT16)
    with pytest.raises(ValueError):
        ops.check_op(ReduceOp.BXOR, dtypes.BFLOAT16)


def test_native_uses_the_table():
    pytest.importorskip("pycoll._native", reason="pycoll's native module is not built")
    from pycoll import native

    assert native.DTYPE_CODES is dtypes.DTYPE_CODES
    assert native.OP_CODES is ops.OP_CODES
    from pycoll.native import DTYPE_CODES, OP_CODES  # the names the project imports

    assert (DTYPE_CODES, OP_CODES) == (dtypes.DTYPE_CODES, ops.OP_CODES)
    for dt, code in dtypes.DTYPE_CODES.items():
        assert native.lib.pycoll_dtype_size(code) == dtypes.ITEMSIZES[dt], dtypes.NAME_OF[dt]


@pytest.mark.parametrize("name", DESIGN)
def test_native_and_numpy_reductions_agree(name):
    dt = dtypes.DTYPES[name]
    n = ops.NATIVE_MIN_ELEMENTS + 5  # the native kernels
    rng = np.random.default_rng(7)
    a, b = (rng.integers(0, 3, n).astype(dt) for _ in range(2))
    op = ReduceOp.SUM if dtypes.KINDS[dt] != "bool" else ReduceOp.LOR
    out = np.empty(n, dt)
    ops.reducer(op, dt)(a, b, out)
    assert np.array_equal(out.astype(np.complex128), ops.reference([a, b], op).astype(np.complex128))
    native = ops._native_reducer(op)
    if native is not None:
        out[...] = 0
        native(a, b, out)
        assert np.array_equal(out.astype(np.complex128), ops.reference([a, b], op).astype(np.complex128))


def test_numpy_only_without_a_native_build(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycoll._native", None)  # the import fails as without a build
    assert ops._native_reducer(ReduceOp.SUM) is None


@pytest.mark.parametrize("name", DESIGN)
def test_buffers_keep_every_dtype(name):
    dt = dtypes.DTYPES[name]
    arr = np.zeros((2, 3), dt)
    flat = buffers.as_array(arr, writable=True)
    assert flat.dtype == dt and flat.shape == (6,)
    assert buffers.as_bytes(arr).nbytes == 6 * dtypes.ITEMSIZES[dt]

"""Loading UCX for pycoll's UCX transport.

``pycoll._ucx`` (built at install, see native/ucx_build.py) is not linked to libucp: this module
makes the UCX libraries available in the global symbol scope first, then imports it.

* If a libucp is already in the process (the MPICH wheel bundles its own UCX, loaded when
  ``mpi4py.MPI`` is imported), that copy is used: ``dlopen(RTLD_NOLOAD | RTLD_GLOBAL)`` promotes it
  to global scope. Two UCX copies in one process break each other, so loading a second is never
  done. Importing mpi4py *after* this loader also works: MPICH's ``libucp.so.0`` dependency is then
  satisfied by the already loaded copy (same soname).
* Otherwise the ``libucx-cu12`` wheel's libraries are loaded with RTLD_GLOBAL in dependency order
  (libucs, which brings libucm, then libucm, libuct, libucp).
* ``PYCOLL_UCX_LIB`` (an environment variable: a path to a ``libucp.so``) loads that library
  instead of the wheel's (its siblings libucm/libucs/libuct first when they are in the same folder);
  a library that cannot be loaded gives a :class:`~pycoll.errors.TransportError`, as does a missing
  build of ``pycoll._ucx``.

The UCX API version passed to ``ucp_init_version`` is the older of the headers' and the loaded
library's (MPICH may bundle an older UCX than the wheel pycoll was compiled against).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Tuple

from pycoll.errors import TransportError

_DEPS = ("libucs.so.0", "libucm.so.0", "libuct.so.0", "libucp.so.0")  # libucs pulls libucm in
_loaded: Optional[Tuple[Any, Any]] = None
_failure: Optional[str] = None
source = ""  # where libucp came from: "process" (already loaded), "wheel", or the PYCOLL_UCX_LIB path


def _wheel_dir() -> str:
    try:
        import libucx  # noqa: PLC0415 - optional: the libucx-cu12 wheel, looked for only if needed
    except ImportError:
        raise OSError("the libucx-cu12 package is not installed (pip install libucx-cu12)") from None
    return os.path.join(os.path.dirname(libucx.__file__), "lib")


def _load_libraries() -> str:
    flags = os.RTLD_GLOBAL | os.RTLD_NOW
    override = os.environ.get("PYCOLL_UCX_LIB", "")
    if override:
        folder = os.path.dirname(override)
        for dep in _DEPS[:-1]:
            if folder and os.path.exists(os.path.join(folder, dep)):
                ctypes.CDLL(os.path.join(folder, dep), mode=flags)
        ctypes.CDLL(override, mode=flags)
        return override
    try:
        ctypes.CDLL("libucp.so.0", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL | os.RTLD_LAZY)
        return "process"
    except OSError:
        pass
    lib = _wheel_dir()
    for dep in _DEPS:
        ctypes.CDLL(os.path.join(lib, dep), mode=flags)
    return "wheel"


def load() -> Tuple[Any, Any]:
    """``(ffi, lib)`` of the UCX binding, loading UCX the first time; a TransportError if it
    cannot be loaded (the reason is kept: later calls fail the same way at once)."""
    global _loaded, _failure, source
    if _loaded is not None:
        return _loaded
    if _failure is not None:
        raise TransportError(_failure)
    try:
        where = _load_libraries()
    except OSError as exc:
        _failure = f"ucx: cannot load libucp ({exc})"
        raise TransportError(_failure) from None
    try:
        from pycoll._ucx import ffi, lib  # noqa: PLC0415 - optional: the UCX binding built at install
    except ImportError as exc:
        _failure = (f"ucx: pycoll's UCX binding is not built or does not load ({exc}); reinstall with "
                    "the UCX headers available: pip install libucx-cu12 && pip install -e .")
        raise TransportError(_failure) from None
    source = where
    _loaded = (ffi, lib)
    return _loaded


def api_version() -> Tuple[int, int]:
    """The UCP API version to initialize with: the older of the headers' and the library's."""
    ffi, lib = load()
    hv = [ffi.new("unsigned *") for _ in range(2)]
    lib.pc_ucx_header_version(*hv)
    v = version()
    return min((hv[0][0], hv[1][0]), (v[0], v[1]))


def version() -> Tuple[int, int, int]:
    """The loaded libucp's version (major, minor, release)."""
    ffi, lib = load()
    v = [ffi.new("unsigned *") for _ in range(3)]
    lib.pc_ucx_version(*v)
    return (v[0][0], v[1][0], v[2][0])


def library_path() -> str:
    """The file of the libucp mapped in this process (from /proc/self/maps), or ''."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libucp.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""

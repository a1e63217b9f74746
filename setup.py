"""Build hook: compile the native modules with cffi (everything else is in pyproject.toml).

``pycoll._native`` is always built. ``pycoll._ucx`` (the UCX transport's binding) is built when the
UCX headers of the ``libucx-cu12`` wheel are importable; without them pycoll installs without the
UCX transport (a warning says so, and PYCOLL_TLS=ucx then raises a TransportError).
"""

import os
import sys
import warnings

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
from ucx_build import ucx_include_dir  # noqa: E402

modules = ["native/build.py:ffibuilder"]
if ucx_include_dir() is not None:
    modules.append("native/ucx_build.py:ffibuilder")
else:
    warnings.warn("pycoll: UCX headers not found (pip install libucx-cu12): building without the UCX "
                  "transport", stacklevel=1)

setup(cffi_modules=modules)

"""Build hook: compile the native module with cffi (everything else is in pyproject.toml)."""

from setuptools import setup

setup(cffi_modules=["native/build.py:ffibuilder"])

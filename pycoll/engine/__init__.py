"""The progress engine (Context) and requests."""

from pycoll.engine.context import Backoff, Context, get_context
from pycoll.engine.request import Request, wait_all

__all__ = ["Backoff", "Context", "Request", "get_context", "wait_all"]

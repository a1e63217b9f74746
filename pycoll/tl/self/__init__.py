"""The transport of a team of one: messages to oneself."""

from pycoll.tl.self.transport import SelfTransport

__all__ = ["SelfTransport"]

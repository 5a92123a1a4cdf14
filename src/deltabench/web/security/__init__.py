"""Access control of the service: bearer tokens (see :mod:`.tokens`)."""

__all__ = ["tokens"]

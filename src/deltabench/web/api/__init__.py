"""The JSON API under ``/api/v1`` (routers assembled in :mod:`.main`)."""

__all__ = ["main"]

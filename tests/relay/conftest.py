"""Fixtures of the relay's tests: the inbox's far sources (see :mod:`.inbox_sources`)."""

from .inbox_sources import far_source, source_kind  # noqa: F401

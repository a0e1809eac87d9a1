"""The reference engine's exceptions (no torch needed to import them)."""

from kvpool.errors import KvpoolError


class EngineError(KvpoolError):
    """A model folder or engine setting the reference engine cannot use."""


class StalePageError(RuntimeError):
    """Attention needed a position whose page the manager already released (or
    never allocated): a paging bug, never a user error."""

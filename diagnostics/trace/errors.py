"""TraceError: a trace file that cannot be read, with a message that says why (shown verbatim)."""

from diagnostics.errors import TorchScopeError


class TraceError(TorchScopeError):
    """Not a trace, not gzip, truncated, empty: the message names the file and the problem."""

"""The record of classify.communication: the communication families found, which kernels count as
communication, and the streams that look like communication though none matched."""

from __future__ import annotations

from diagnostics.results import Record


class CommFamily(Record, frozen=True, kw_only=True):
    family: str
    where: str
    events: int
    names: int
    time_us: float
    example: str


class SuspectStream(Record, frozen=True, kw_only=True):
    """A GPU stream with no communication matched whose kernel time is mostly in names that hint at it."""

    device: int
    stream: int
    kernel_us: float
    hinted_us: float
    share: float
    examples: tuple[str, ...]


class Communication(Record, frozen=True, kw_only=True):
    families: tuple[CommFamily, ...]
    comm_kernels: str | None
    rocm: bool
    suspect_streams: tuple[SuspectStream, ...]
    notes: tuple[str, ...]

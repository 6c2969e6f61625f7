"""The worker's channel to the runner: messages as bytes decoded against a schema, never pickles.

What a job's process sends (its baseline, progress, partial results, its answer; a spare's "ready")
crosses the sandbox: the model's own code runs in that process and can send anything the process
can. So the runner never unpickles it (``Connection.recv()`` runs the sender's ``__reduce__``):
each message is one length-framed msgpack record of bounded size (``MAX_MESSAGE_BYTES``), decoded
by msgspec into one of the typed messages below; anything else is a :class:`ChannelError` and the
runner stops the job. The job process holds its end as a bare file descriptor (:class:`Sender`),
not a ``multiprocessing`` Connection: there is no object left there whose ``send`` pickles.

The same framing as ``multiprocessing.connection`` (a 4-byte big-endian length, then the bytes), so
the runner reads with ``Connection.recv_bytes(MAX_MESSAGE_BYTES)``, which refuses a longer message
from its header, before reading (or allocating) its body.
"""

from __future__ import annotations

import math
import os
import struct
import threading
from typing import Any, Literal, Union

import msgspec

#: The largest message the runner reads from a job (its final result included): 256 MiB.
MAX_MESSAGE_BYTES = 256 << 20


class ChannelError(Exception):
    """A message from a job that is not one of the runner's (or too long): the job is stopped."""


class Baseline(msgspec.Struct, tag="baseline", array_like=True, frozen=True):
    """The job process' resident memory once torch is loaded, before any user code (the first one counts)."""
    rss: int


class Ready(msgspec.Struct, tag="ready", array_like=True, frozen=True):
    """A spare finished its imports (how long they took, torch's intra-op thread count)."""
    import_s: float
    torch_threads: int | None


class Progress(msgspec.Struct, tag="progress", array_like=True, frozen=True):
    fraction: float
    message: str


class Partial(msgspec.Struct, tag="partial", array_like=True, frozen=True):
    """``to_plain`` of a partial result: builtins, decoded by the runner against the analysis' type."""
    result: Any


class Ok(msgspec.Struct, tag="ok", array_like=True, frozen=True):
    """``to_plain`` of the result: builtins, decoded by the runner against the analysis' type."""
    result: Any


class Failed(msgspec.Struct, tag="failed", array_like=True, frozen=True):
    status: Literal["error", "oom"]
    error_type: str
    error: str
    log: str


Message = Union[Baseline, Ready, Progress, Partial, Ok, Failed]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Message).decode


def encode(msg: Message) -> bytes:
    """``msg`` as the bytes the runner decodes; a result holding something other than builtins, or past
    MAX_MESSAGE_BYTES, is a ChannelError saying so."""
    try:
        data = _encode(msg)
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise ChannelError(f"it holds something other than plain data ({type(e).__name__}: {e})") from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"it is {len(data) / 2**20:,.0f} MiB, over the limit of "
                           f"{MAX_MESSAGE_BYTES / 2**20:,.0f} MiB of one message from a job")
    return data


def decode(data: bytes) -> Message:
    """One message from a job's bytes, checked against the schema (ChannelError otherwise)."""
    try:
        msg = _decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise ChannelError(f"the job sent {len(data):,} bytes that are not a message of the runner's ({e}); "
                           f"a job's process sends data, never objects") from None
    if isinstance(msg, Progress) and not math.isfinite(msg.fraction):
        raise ChannelError(f"the job sent a progress of {msg.fraction}")
    return msg


def receive(conn) -> Message:
    """The next message on ``conn`` (the runner's end, a multiprocessing Connection), read as bytes.
    EOFError when the job's end is closed; ChannelError for a message too long or not the schema's."""
    try:
        data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    except EOFError:
        raise
    except OSError as e:  # "bad message length": the header announced more than the limit
        raise ChannelError(f"the job sent a message over the limit of {MAX_MESSAGE_BYTES / 2**20:,.0f} MiB "
                           f"or a broken one ({e})") from None
    return decode(data)


class Sender:
    """The job's end: a bare file descriptor and a lock (no Connection, nothing that pickles).

    Made from a Connection's descriptor (duplicated; the Connection is closed). ``send`` writes one
    framed message; ``close`` is idempotent (the guardian and the namespaces' waiting processes close
    their copies)."""

    __slots__ = ("fd", "_lock")

    def __init__(self, conn):
        self.fd = os.dup(conn.fileno())
        conn.close()
        self._lock = threading.Lock()

    def send(self, msg: Message) -> None:
        data = encode(msg)
        frame = struct.pack("!i", len(data)) + data
        with self._lock:
            view = memoryview(frame)
            while view:
                view = view[os.write(self.fd, view):]

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def send_job(conn, args: "JobArgs") -> None:
    """The runner hands a spare its job (``conn``: the runner's end, a Connection), as bytes too."""
    conn.send_bytes(_encode_args(args))


class JobArgs(msgspec.Struct, array_like=True, frozen=True):
    """What a spare needs for its job (``job_main``'s arguments)."""
    job: dict[str, Any]
    artifact_dir: str
    mem_limit: int | None
    tmp_dir: str | None
    hidden: tuple[str, ...]
    caps: dict[str, int | None]


_encode_args = msgspec.msgpack.Encoder().encode
_decode_args = msgspec.msgpack.Decoder(JobArgs).decode


def receive_job(conn) -> JobArgs:
    """A spare's job, from the runner (``conn``: the spare's end)."""
    return _decode_args(conn.recv_bytes(MAX_MESSAGE_BYTES))

"""CUDA's caching allocator, replayed on a list of allocations and frees (no torch): what
``torch.cuda.max_memory_allocated`` counts for a sequence of tensor sizes.

The allocator hands out *blocks*, and its "allocated" figure is the sum of the blocks' sizes, not of
the sizes asked for. A request is rounded up to 512 bytes; it is served by the smallest cached free
block of its pool that is large enough (best fit); that block is split only when what would be left
is worth keeping (at least 512 bytes in the small pool, more than 1 MiB in the large one), so a
request served by a slightly larger free block is charged the whole block. A request no cached
block serves gets a new segment: 2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB, the request
rounded up to 2 MiB above that. Freed blocks merge with free neighbours of their segment and stay
cached. This follows c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize, kSmallSize, kSmallBuffer,
kLargeBuffer, kMinLargeAlloc, kRoundLarge; ``round_size``, ``get_allocation_size``, ``get_free_block``,
``should_split``, ``free_block``) with its default settings (no max_split_size, no expandable
segments, no power-of-two rounding), one device and one stream.

The plan replays the step twice (the warm-up step caches the segments the measured step reuses, as
the Memory analysis' protocol does) and reads the second step's peak; the difference from the
requested bytes is the "fragmentation" part of the prediction.
"""

from __future__ import annotations

import bisect

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to this use the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small pool's segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: a segment for requests between 1 and 10 MiB
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to this


def round_size(n: int) -> int:
    """The block size a request of ``n`` bytes needs (round_size)."""
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(n: int) -> int:
    """The segment cudaMalloc'd for a rounded request of ``n`` bytes that no cached block serves."""
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("seg", "offset", "size", "free", "prev", "next", "small")

    def __init__(self, seg: int, offset: int, size: int, small: bool):
        self.seg, self.offset, self.size, self.small = seg, offset, size, small
        self.free = True
        self.prev = self.next = None

    def key(self):
        return (self.size, self.seg, self.offset)


class CachingAllocator:
    """The allocator's bookkeeping: ``malloc(n) -> handle``, ``free(handle)``; ``allocated``, ``peak``,
    ``reserved``, ``requested`` (the sum of the sizes asked for) as the allocator's statistics count them."""

    def __init__(self):
        self.pools = {True: [], False: []}  # small? -> sorted keys of free blocks
        self.by_key: dict = {}
        self.segments = 0
        self.reserved = 0
        self.allocated = 0
        self.requested = 0
        self.peak = 0
        self.peak_requested = 0  # requested bytes at the allocated peak

    def reset_peak(self) -> None:
        self.peak = self.allocated
        self.peak_requested = self.requested

    def _insert(self, b: _Block) -> None:
        k = b.key()
        bisect.insort(self.pools[b.small], k)
        self.by_key[k] = b

    def _remove(self, b: _Block) -> None:
        k = b.key()
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, k)
        del pool[i]
        del self.by_key[k]

    def malloc(self, nbytes: int):
        size = round_size(int(nbytes))
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            block = self.by_key[pool[i]]
            self._remove(block)
        else:  # a new segment
            seg_bytes = segment_size(size)
            self.segments += 1
            self.reserved += seg_bytes
            block = _Block(self.segments, 0, seg_bytes, small)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(block.seg, block.offset + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.free = False
        self.allocated += block.size
        self.requested += int(nbytes)
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.peak_requested = self.requested
        return (block, int(nbytes))

    def free(self, handle) -> None:
        block, nbytes = handle
        self.allocated -= block.size
        self.requested -= nbytes
        block.free = True
        for other in (block.prev, block.next):  # merge with free neighbours in the segment
            if other is not None and other.free:
                self._remove(other)
                if other is block.prev:
                    block.offset = other.offset
                    block.prev = other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self._insert(block)


def replay(log: list, lazy_state: bool = True) -> dict:
    """The device's view of a traced step from the ledger's log (ledger.Ledger with a CUDA target).

    The log holds ("a", key, bytes, category) and ("f", key) for every storage, ("s", sizes) for an op's
    scratch (allocated after its outputs, freed before it returns), ("w", name, bytes) where a thread
    first takes a library workspace, ("p", phase) where a phase starts. What exists before the first
    phase (parameters, inputs, optimizer state) is allocated once, in order, and kept; the step then runs
    twice, as the Memory analysis measures it: a warm-up step, which takes the workspaces and creates the
    optimizer state when its optimizer phase starts (``lazy_state``: torch's optimizers make it lazily),
    after which what the step left (gradients, caches) is freed, then the measured step, whose peak is
    read. Returns {"peak", "requested", "phases": {phase: allocated peak}, "workspaces": {name: bytes},
    "reserved"}."""
    first = next((i for i, e in enumerate(log) if e[0] == "p" and e[1] != "setup"), len(log))
    setup, step = log[:first], log[first:]
    alloc = CachingAllocator()
    kept: dict = {}
    deferred = []
    for e in setup:
        if e[0] == "a":
            if lazy_state and e[3] == "optimizer state":
                deferred.append(e)
            else:
                kept[e[1]] = alloc.malloc(e[2])
        elif e[0] == "f" and e[1] in kept:
            alloc.free(kept.pop(e[1]))
    workspaces: dict[str, int] = {}
    phases: dict[str, int] = {}

    def run(warm: bool) -> dict:
        live: dict = {}
        phase = "setup"
        for e in step:
            kind = e[0]
            if kind == "a":
                live[e[1]] = alloc.malloc(e[2])
            elif kind == "f":
                h = live.pop(e[1], None)
                if h is not None:  # what existed before the step (kept) stays: its end-of-trace frees are ignored
                    alloc.free(h)
                continue
            elif kind == "s":
                hs = [alloc.malloc(n) for n in e[1]]
                if not warm:
                    phases[phase] = max(phases.get(phase, 0), alloc.allocated)
                for h in hs:
                    alloc.free(h)
                continue
            elif kind == "w":
                if warm:
                    workspaces[e[1]] = e[2]
                    alloc.malloc(e[2])
            elif kind == "p":
                phase = e[1]
                if warm and phase == "optimizer":
                    for d in deferred:
                        kept[d[1]] = alloc.malloc(d[2])
                    deferred.clear()
            if not warm:
                phases[phase] = max(phases.get(phase, 0), alloc.allocated)
        return live

    left = run(warm=True)
    for h in left.values():  # zero_grad(set_to_none=True) and whatever else the step left
        alloc.free(h)
    alloc.reset_peak()
    run(warm=False)
    return {"peak": alloc.peak, "requested": alloc.peak_requested, "phases": phases, "workspaces": workspaces,
            "reserved": alloc.reserved}

"""The parsed trace's shape in names only: its columns (COLUMNS) and the key its cache entry is kept under
(CACHE_ENTRY). Imports nothing, so the trace cache reads them on a reopen without numpy or pandas (issue #42);
model.Trace is built on them."""

# Columns of Trace.events, in order. Integer columns use -1 for "absent", float ones NaN.
# ext_id, corr: "External id" and "correlation" (host op <-> runtime call <-> kernel); device,
# stream: where GPU work ran; flow_id: flow arrows; nbytes, total_allocated, device_type: memory
# events (nbytes is also a memcpy's / memset's "bytes", -1 there when not recorded); seq, fwd_tid: an op's autograd "Sequence number" and, on a backward op, its "Fwd thread
# id"; grid, block ("64×1×1"), registers, occupancy (est. achieved %): a kernel's launch.
COLUMNS = (
    "ts", "dur", "ph", "cat", "name", "pid", "tid",
    "ext_id", "corr", "device", "stream", "flow_id", "nbytes", "total_allocated", "device_type",
    "seq", "fwd_tid", "grid", "block", "registers", "occupancy",
)

#: Trace._cache key of the trace cache entry a trace was read from or kept in (diagnostics.trace.cache):
#: not a computed view, so dropping the views keeps it.
CACHE_ENTRY = "trace_cache_entry"
#: Trace._cache key of the entry the trace cache has yet to write (cache.cached_load(defer_write=True), then
#: cache.finish_write): kept when the views are dropped, like CACHE_ENTRY.
CACHE_PENDING = "trace_cache_pending"

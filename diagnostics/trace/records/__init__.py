"""The trace layer's typed records: each part's plain data as frozen msgspec Structs, one module per producer,
made by the function that computes the part (torch-free, like the rest of the layer).

    timeline.py       Timeline (timeline.timeline_data; ranks.merge_timelines)
    breakdowns.py     TraceSummary, TemporalBreakdown, TopOperators, IdleTime, LaunchStats (breakdowns.py)
    communication.py  Communication (classify.communication)
    gpu_activity.py   KernelSequences, QueueLength, MemcpyBandwidth, Annotations, LaunchDelay, CommOverlap
    serving.py        Serving (serving.serving)
    critical_path.py  CriticalPath (critical_path.critical_path)
    ranks.py          Ranks (ranks.analyse; ranks.analyse_ranks: its plain form, for attach's job)
    diff.py           TraceDiff (diff.diff_traces)

Times are µs unless a field says otherwise (``_ms``, ``_s``). A part that older stored runs did not hold is
UNSET ("this result predates it"); a figure the trace does not hold is None ("not counted"), never 0. The
field names are the stored runs' keys: renaming one breaks the runs stored before (tests/test_stored_runs.py).
The analyses' results (diagnostics.analyses.trace.result) hold these records.
"""

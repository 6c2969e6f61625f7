"""Ranks x threads beyond the cores: no rank is called a straggler for waiting on a core."""

import copy

from diagnostics.analyses.distributed.job import oversubscribed


def result_with_straggler():
    return {"stragglers": [1], "metrics": {"stragglers": 1}, "notes": [],
            "ranks": [{"rank": 0, "straggler": False}, {"rank": 1, "straggler": True}]}


def test_more_busy_threads_than_cores_calls_no_straggler_and_says_why():
    r = result_with_straggler()
    oversubscribed(r, nproc=4, threads=1, on_gpu=False, cores=2)
    assert r["cpu"] == {"ranks": 4, "threads_per_rank": 1, "cores": 2, "oversubscribed": True}
    assert r["stragglers"] == [] and r["metrics"]["stragglers"] == 0 and not any(x["straggler"] for x in r["ranks"])
    assert r["notes"][0].startswith("4 ranks x 1 thread(s) = 4 busy threads on 2 CPU cores")
    assert "rank(s) 1 would have been" in r["notes"][0]


def test_within_the_cores_or_on_gpus_the_straggler_stands():
    for kw in ({"nproc": 2, "threads": 1, "on_gpu": False, "cores": 2},
               {"nproc": 4, "threads": 2, "on_gpu": True, "cores": 2}):
        r = result_with_straggler()
        before = copy.deepcopy(r)
        oversubscribed(r, **kw)
        assert r["cpu"]["oversubscribed"] is False
        assert {k: r[k] for k in before} == before

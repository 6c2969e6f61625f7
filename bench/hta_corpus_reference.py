"""Reference figures of Holistic Trace Analysis on the public trace corpus (tests/data/traces/public),
written to tests/data/traces/public/hta_reference.json for tests/trace/test_public_corpus.py.

    pip install --target /tmp/htapkg --no-deps HolisticTraceAnalysis==0.5.0
    PYTHONPATH=/tmp/htapkg .venv/bin/python bench/hta_corpus_reference.py

HTA is not a dependency of TorchScope: this script is run by hand when the corpus changes, and the
tests read the figures it wrote (they never need HTA). Per trace (each opened alone, as one rank):
the temporal breakdown (idle, compute, non-compute and kernel time, µs), the idle time breakdown per
stream and category, and the communication/computation overlap (%). A trace HTA cannot read gets
its error message instead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "traces" / "public"
OUT = CORPUS / "hta_reference.json"


def _num(v):
    v = float(v)
    return None if math.isnan(v) else v


def reference(path: Path) -> dict:
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as tmp:
        # HTA reads a folder of rank traces; one file alone is rank 0 (or its distributedInfo rank).
        shutil.copy(path, Path(tmp) / path.name)
        try:
            a = TraceAnalysis(trace_dir=tmp, include_last_profiler_step=True)
        except Exception as e:  # noqa: BLE001  what HTA says about a trace it cannot read is the figure
            return {"hta_error": f"{type(e).__name__}: {e}"[:300]}
        out = {}
        for key, fn in (("temporal", lambda: a.get_temporal_breakdown(visualize=False)),
                        ("idle", lambda: a.get_idle_time_breakdown(visualize=False,
                                                                    show_idle_interval_stats=False)[0]),
                        ("overlap", lambda: a.get_comm_comp_overlap(visualize=False))):
            try:
                df = fn()
            except Exception as e:  # noqa: BLE001
                out[key] = {"hta_error": f"{type(e).__name__}: {e}"[:300]}
                continue
            if key == "temporal":
                r = df.iloc[0]
                out[key] = {k: _num(r[k + "(us)"]) for k in ("idle_time", "compute_time", "non_compute_time",
                                                                "kernel_time")}
            elif key == "idle":
                out[key] = [{"stream": str(int(r["stream"])), "category": str(r["idle_category"]),
                             "idle_us": _num(r["idle_time"])} for _, r in df.iterrows()]
            else:
                out[key] = {"overlap_pct": _num(df.iloc[0]["comp_comm_overlap_pctg"])}
        return out


def main() -> int:
    # HTA rounds a trace with sub-µs timestamps (start up, end down) unless told not to; TorchScope keeps
    # them, so the reference keeps them too.
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    import hta

    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))
    files = [p for p in files if p != OUT]
    traces = {}
    for p in files:
        rel = str(p.relative_to(CORPUS))
        traces[rel] = reference(p)
        print(rel, json.dumps(traces[rel])[:200])
    version = getattr(hta, "__version__", None)
    if version is None:
        from importlib.metadata import version as pkg_version
        version = pkg_version("HolisticTraceAnalysis")
    doc = {"hta_version": version,
           "how": "bench/hta_corpus_reference.py: each trace alone in a folder, TraceAnalysis(trace_dir=..., include_last_profiler_step=True: every step, as TorchScope reads them), "
                  "get_temporal_breakdown, get_idle_time_breakdown (stream, idle_category, idle_time), "
                  "get_comm_comp_overlap; HTA_DISABLE_NS_ROUNDING=1 (sub-µs timestamps kept, as TorchScope "
                  "keeps them); times in µs as HTA reports them",
           "traces": traces}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

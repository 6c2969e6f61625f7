"""Trace worker processes start under a main script that cannot run outside its host (an AppTest's page
function, Streamlit's page script): multiprocessing re-ran it in every worker, which died at start, and
a pool replaced it forever (the suite's ingest tests hung 300 s after an AppTest test). The Dask workers
start under plain_main(); the split's helpers are `python -m` processes that never import the page."""

import sys
import threading
import types

import pytest

from diagnostics.trace import ingest, load_trace
from diagnostics.trace.mainless import plain_main

from tests.trace.test_ingest import CPU  # the small CPU trace the ingest tests use
from tests.trace.test_ingest_split import _same


@pytest.fixture
def hostile_main(tmp_path, monkeypatch):
    script = tmp_path / "page.py"
    script.write_text("_options_script(*__args, **__kwargs)\n")  # as AppTest.from_function writes it
    fake = types.ModuleType("__main__")
    fake.__file__ = str(script)
    fake.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", fake)
    return fake


def test_plain_main_hides_a_script_main_and_puts_it_back(hostile_main):
    with plain_main():
        assert sys.modules["__main__"] is not hostile_main and not hasattr(sys.modules["__main__"], "__file__")
    assert sys.modules["__main__"] is hostile_main


@pytest.mark.timeout(120)
def test_split_helpers_under_a_page_script_give_the_one_process_trace(hostile_main, monkeypatch):
    """The Trace explorer's split load inside Streamlit (a page script as main, other threads alive)."""
    stop = threading.Event()
    alive = threading.Thread(target=stop.wait, daemon=True)
    alive.start()
    monkeypatch.setattr(ingest, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_cores", lambda: 2)
    try:
        whole = load_trace(CPU)
        split = ingest._load_split(CPU, CPU.name, CPU.stat().st_size, False)
    finally:
        stop.set()
    assert split is not None, "the helper failed under a page-script main"
    _same(split, whole)
    assert sys.modules["__main__"] is hostile_main


@pytest.mark.slow  # a LocalCluster of one worker process starts (a few seconds)
@pytest.mark.timeout(180)
def test_a_dask_local_cluster_under_a_page_script_starts_its_workers(hostile_main):
    """The nannies spawn their workers at the LocalCluster's start: under an AppTest's page script as main,
    every one failed ("name '__args' is not defined") and `--dask local:N` ended "Nanny failed to start"."""
    pytest.importorskip("distributed")
    from diagnostics.trace.ranks.executors import DaskExecutor

    with DaskExecutor("local:1", [], memory_limit="1GiB") as ex:
        assert ex.where == "a Dask LocalCluster of 1 worker processes"
        assert ex.client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    assert sys.modules["__main__"] is hostile_main

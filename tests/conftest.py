"""Shared test setup: an isolated data folder for the whole run, and a hook-leak check."""

import os
import tempfile

# Set before any module reads it, so AppTest pages, the runner and the store use a temp folder.
# Under pytest-xdist each worker gets its own (the workers inherit the controller's environment, and
# a shared folder shows one worker's runs in another's History page).
if os.environ.get("PYTEST_XDIST_WORKER") or "TORCHSCOPE_DATA_DIR" not in os.environ:
    os.environ["TORCHSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix="torchscope-test-")

# No spare workers in tests (each imports torch in the background: AppTest runs app.py, which keeps
# them); the tests of spares turn them on themselves, the browser tests' server gets the default.
os.environ["TORCHSCOPE_SPARE_WORKERS"] = "0"


def _threads_per_process() -> int:
    """torch's threads in each test process: the usable cores shared among the pytest-xdist workers (at
    most 2). Two workers with two OpenMP threads each on a 2-core machine oversubscribe it: a thread that
    loses its core stalls every barrier of the op it is in, and small ops (a 32-wide Linear) took 100x
    their time (3 ms instead of 30 us), which made the model-running tests several times slower."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, min(2, cores // max(1, workers)))


TEST_THREADS = _threads_per_process()
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Before torch is imported, so this process and every process a test starts (the runner's workers, the
    # CLI, attached scripts: the sandbox keeps OMP_*) use as many threads, unless the caller chose already.
    # One process (the serial part, a plain pytest) keeps each started process' own default.
    os.environ.setdefault("OMP_NUM_THREADS", str(TEST_THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(TEST_THREADS)


def hooks_left(model: torch.nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(getattr(m, "_full_backward_hooks", {}) or {}) + len(getattr(m, "_full_backward_pre_hooks", {}) or {})
    for p in model.parameters():
        n += len(getattr(p, "_backward_hooks", None) or {})
        n += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return n


@pytest.fixture
def no_hooks_left():
    """Yields a checker: call it with a model after an analysis ran; asserts nothing was left on it."""

    def check(model):
        assert hooks_left(model) == 0, "an analysis left hooks on the model"

    return check


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


APP_PATH = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "app.py")


def _navigation_like_the_server():
    """AppTest resets PagesManager.uses_pages_directory before every run, so with a pages/ folder
    it replays reruns as a v1 multipage app (the page script alone, without app.py's sidebar).
    The real server sets the flag once; app.py's st.navigation turns it off for good. Do the same."""
    from streamlit.runtime.pages_manager import PagesManager

    original = PagesManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = init


_navigation_like_the_server()


def _until_jobs_end(at) -> None:
    """In a browser a running job's panel reruns the page when the job ends (ui.jobs); AppTest runs a
    script once per run(). So after each run, while this session has background jobs, wait for them
    and run again: the test sees the page as the user sees it once the jobs are done."""
    from ui.background import manager
    from ui.state import JOB_RERUN, SESSION_ID

    run_once = at._run

    def run(widget_state=None, timeout=None):
        result = run_once(widget_state, timeout)
        session = at.session_state[SESSION_ID] if SESSION_ID in at.session_state else None
        if session is not None and manager().pending(session):
            if manager().wait(session, timeout or at.default_timeout):
                at.session_state[JOB_RERUN] = True  # what the job panel sets before its st.rerun()
                return at._tree.run(timeout=timeout)  # the current widgets, as the page's rerun has them
        return result

    at._run = run


@pytest.fixture
def new_app():
    """Factory for an AppTest of the whole app (sidebar + navigation), started on the Model page.
    ``follow_jobs`` (default): each run() returns once the background jobs it started have ended."""
    from streamlit.testing.v1 import AppTest

    def make(timeout: float = 240, follow_jobs: bool = True):
        at = AppTest.from_file(APP_PATH, default_timeout=timeout)
        if follow_jobs:
            _until_jobs_end(at)
        return at

    return make


# --cuda-only: just the tests that need a GPU (skipif reason "needs CUDA ..."), for a lent GPU machine.
def pytest_addoption(parser):
    parser.addoption("--cuda-only", action="store_true", help="run only the tests that need CUDA")


#: Test files run alone (`make test` runs the rest in 2 pytest-xdist workers, then these in one process): each
#: measures the machine or needs it to itself, and a test in the other worker is the "other process" it finds.
SERIAL = {
    "tests/e2e/": "a dashboard server and Chromium each; the UI's waits are timed",
    "tests/measure/test_disturbance.py": "counts other processes' CPU: the other worker is one",
    "tests/analyses/plan/test_sharded.py": "gloo ranks in processes of their own, on fixed ports",
    "tests/trace/test_rank_cluster.py": "a Dask LocalCluster of worker processes",
    "tests/trace/test_dask_trust.py": "a Dask LocalCluster",
    "tests/trace/test_mainless.py": "a Dask LocalCluster and forkserver pools under a stand-in main script",
    "tests/reliability/test_sandbox.py": "namespaced workers with DataLoader worker pools",
}


@pytest.hookimpl(tryfirst=True)  # before -m selects: `-m serial` / `-m "not serial"` see the marks added here
def pytest_collection_modifyitems(config, items):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    for item in items:
        rel = item.path.resolve().relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if any(rel.startswith(prefix) for prefix in SERIAL):
            item.add_marker(pytest.mark.serial)
    if not config.getoption("--cuda-only"):
        return
    import re

    def needs_cuda(item):
        return any(re.match(r"needs CUDA", str(m.kwargs.get("reason", ""))) for m in item.iter_markers("skipif"))

    keep = [i for i in items if needs_cuda(i)]
    config.hook.pytest_deselected(items=[i for i in items if not needs_cuda(i)])
    items[:] = keep

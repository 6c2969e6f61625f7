"""Shared test setup: an isolated data folder for the whole run, and a hook-leak check."""

import os
import tempfile

# Set before any module reads it, so AppTest pages, the runner and the store use a temp folder.
# Under pytest-xdist each worker gets its own (the workers inherit the controller's environment, and
# a shared folder shows one worker's runs in another's History page).
if os.environ.get("PYTEST_XDIST_WORKER") or "TORCHSCOPE_DATA_DIR" not in os.environ:
    os.environ["TORCHSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix="torchscope-test-")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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


@pytest.fixture
def new_app():
    """Factory for an AppTest of the whole app (sidebar + navigation), started on the Model page."""
    from streamlit.testing.v1 import AppTest

    def make(timeout: float = 240):
        return AppTest.from_file(APP_PATH, default_timeout=timeout)

    return make

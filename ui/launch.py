"""Start the dashboard warm: ``python -m ui.launch [streamlit run options]`` (what ``make run`` runs).

It is ``streamlit run app.py``, plus what a first visitor would otherwise wait for (Streamlit runs no
app code before a session connects):

* at once, before Streamlit is even imported: the spare worker starts importing torch and the Model
  page's job (``ui.background.start_spares``; app.py asks again on every run, so a plain
  ``streamlit run app.py`` still gets spares, one session later). A spare serves a job only in the
  environment it started in, so the changes Streamlit makes to this process as it starts are made
  first (STREAMLIT_ENV, the app's folder on sys.path); once the server listens, any other change
  (a secrets.toml's values, a newer Streamlit) replaces the spare, and the server log says so;
* once the server listens: this process imports what the pages draw with (the sidebar, every result
  view, pandas, plotly), then moves everything loaded so far out of the garbage collector's reach
  (``gc.freeze``). Streamlit collects garbage after every script run (``runner.postScriptGC``): a full
  collection over the imported modules' objects cost 0.06 s of CPU (0.12-0.4 s of wall time under
  load) on every page switch and on every refresh of a running job's panel; frozen, it scans only
  what the sessions made since.

It listens on 127.0.0.1 unless ``--server.address`` says otherwise; served on another address without
an access token it starts in server-safe mode and says so (``ui.access``).

Streamlit has no start-up hook for an app run with ``streamlit run``; the launcher wraps the private
``streamlit.web.bootstrap._on_server_start`` (streamlit is pinned in requirements.txt). Should that
name go away, the spares still start early and the server log says the imports were not warmed;
tests/e2e/test_launch.py fails.
"""

from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import sys
import threading
from pathlib import Path

from ui import access

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
#: What the server imports ahead of the first session, besides every module of ui.views.
WARM_MODULES = ("ui.sidebar", "ui.jobs", "ui.widgets", "ui.notices", "ui.frame", "ui.state",
                "diagnostics.render.html", "diagnostics.history")
#: Written to the server log once the warm-up is done (tests and benchmarks wait for it).
WARM_LOG_LINE = "torchscope: warm:"


#: What Streamlit sets in the environment as it starts: set before the spare starts, so the spare
#: serves the server's jobs (a spare serves only the environment it was started in).
STREAMLIT_ENV = {"MPLBACKEND": "Agg",  # streamlit/__init__.py, at import
                 "MAPBOX_API_KEY": ""}  # web.bootstrap.prepare_streamlit_environment (a default only)


def start_spares_early() -> tuple:
    """The spare worker, started in the environment the server will have once Streamlit started;
    returns that environment (``runner.spawn_environment``)."""
    from diagnostics.runner import spawn_environment

    os.environ["MPLBACKEND"] = STREAMLIT_ENV["MPLBACKEND"]
    os.environ.setdefault("MAPBOX_API_KEY", STREAMLIT_ENV["MAPBOX_API_KEY"])
    if str(ROOT) not in sys.path:  # bootstrap._fix_sys_path (python -m put it there already)
        sys.path.insert(0, str(ROOT))
    expected = spawn_environment()
    from ui.background import start_spares

    start_spares()
    return expected


def check_spare_environment(expected: tuple) -> list[str]:
    """Once Streamlit has started: what it changed beyond STREAMLIT_ENV (a secrets.toml's values, a
    new Streamlit) would leave the early spare unused; it is replaced now and the log says why.
    Returns the names that changed."""
    from diagnostics.runner import keep_spares, spares, spawn_environment

    now = spawn_environment()
    if now == expected or not spares().size:
        return []
    before, after = dict(expected[0]), dict(now[0])
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    changed += [what for what, i in (("the working folder", 1), ("sys.path", 2), ("the interpreter", 3))
                if expected[i] != now[i]]
    print(f"torchscope: Streamlit's start-up changed {', '.join(changed)} after the spare worker started: it is "
          f"replaced (the first page waits for the new one's imports)", file=sys.stderr, flush=True)
    size = spares().size
    spares().close()
    keep_spares(size)
    return changed


def warm_up(expected: tuple | None = None) -> None:
    """The spare's environment checked (``expected``: as start_spares_early returned it), this
    process' imports for the pages, then the GC freeze."""
    import time

    if expected is not None:
        check_spare_environment(expected)
    t = time.monotonic()
    failed = []
    import ui.views

    names = list(WARM_MODULES) + [f"ui.views.{m.name}" for m in pkgutil.iter_modules(ui.views.__path__)]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the page that needs it imports it again, and shows the error then
            failed.append(f"{name} ({type(e).__name__}: {e})")
    gc.collect()
    gc.freeze()
    print(f"{WARM_LOG_LINE} {len(names) - len(failed)} modules imported in "
          f"{time.monotonic() - t:.2f} s; {gc.get_freeze_count()} objects frozen out of the collector's reach"
          + (f"; not imported: {', '.join(failed)}" if failed else ""), file=sys.stderr, flush=True)


def _hook_server_start(expected: tuple) -> bool:
    from streamlit.web import bootstrap

    original = getattr(bootstrap, "_on_server_start", None)
    if original is None:
        return False

    def on_server_start(server) -> None:
        original(server)
        threading.Thread(target=warm_up, args=(expected,), daemon=True, name="torchscope-warm-up").start()

    bootstrap._on_server_start = on_server_start
    return True


def server_address(args: list[str]) -> tuple[list[str], str]:
    """(the arguments for ``streamlit run``, the address the server will listen on): the one given
    (``--server.address X`` / ``--server.address=X``, or STREAMLIT_SERVER_ADDRESS), else 127.0.0.1, added
    to the arguments (Streamlit's own default is every interface)."""
    args = list(args)
    for i, a in enumerate(args):
        if a == "--server.address" and i + 1 < len(args):
            return args, args[i + 1]
        if a.startswith("--server.address="):
            return args, a.split("=", 1)[1]
    if "STREAMLIT_SERVER_ADDRESS" in os.environ:
        return args, os.environ["STREAMLIT_SERVER_ADDRESS"]
    return args + ["--server.address", access.LOCAL_ADDRESS], access.LOCAL_ADDRESS


def main(argv: list[str] | None = None) -> None:
    args, address = server_address(sys.argv[1:] if argv is None else argv)
    try:  # before the spare starts: it inherits server-safe mode if the address calls for it
        said = access.exposure(address)
    except access.AccessError as e:
        raise SystemExit(f"torchscope: {e}") from None
    if said:
        print(said, file=sys.stderr, flush=True)
    expected = start_spares_early()
    from streamlit.web import cli

    if not _hook_server_start(expected):
        print("torchscope: this Streamlit has no bootstrap._on_server_start: the pages' imports are not warmed "
              "up (the first session pays them)", file=sys.stderr, flush=True)
    cli.main(args=["run", str(APP), *args], prog_name="streamlit")


if __name__ == "__main__":
    main()

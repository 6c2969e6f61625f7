"""``python -m diagnostics``: the command line (see diagnostics.cli.main). ``run`` (attach mode) goes
straight to its own module: the registry and every analysis' declaration are not imported before the
user's script starts (a fixed start-up cost of ``run``)."""

import sys


def exit_now(code) -> None:
    """End ``run`` with ``code`` once its output is out: the exit handlers (atexit, logging's) run, stdout and
    stderr are flushed, then the process ends without the interpreter's teardown of its modules (pandas,
    numpy and the trace layer loaded for the analysis: 0.25-0.4 s of every run's wall on a 2-core machine,
    with nothing to write). Where a thread that is not a daemon still runs, or a flush fails, Python's own
    exit instead (it waits for the thread, and reports a broken pipe as it would)."""
    import atexit
    import os
    import threading

    code = 0 if code is None else code
    if not isinstance(code, int) or any(t is not threading.main_thread() and not t.daemon and t.is_alive()
                                        for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        from diagnostics.cli.attach import main as run_main

        exit_now(run_main(sys.argv[2:]))
    from diagnostics.cli.main import main

    sys.exit(main())

"""``python -m diagnostics``: the command line (see diagnostics.cli.main). ``run`` (attach mode) goes
straight to its own module: the registry and every analysis' declaration are not imported before the
user's script starts (a fixed start-up cost of ``run``)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        from diagnostics.cli.attach import main as run_main

        sys.exit(run_main(sys.argv[2:]))
    from diagnostics.cli.main import main

    sys.exit(main())

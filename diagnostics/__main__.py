"""``python -m diagnostics``: the command line (see diagnostics.cli.main)."""

import sys

from diagnostics.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

"""Runs a script as __main__ after torch.manual_seed(SEED) (default 0): for scripts that seed nothing."""
import os
import runpy
import sys

import torch

torch.manual_seed(int(os.environ.get("SEED", "0")))
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")

"""One-click fixes, tried side by side: ``FIXES`` (catalog.py) and the trial harness (trial.py)."""

from diagnostics.fixes.catalog import FIX_IDS, FIXES, Fix, FixNotApplicable, get_fix, run_fix

__all__ = ["FIXES", "FIX_IDS", "Fix", "FixNotApplicable", "get_fix", "run_fix"]

"""The engine never imports streamlit: checked in a fresh interpreter."""

import pkgutil
import subprocess
import sys

import diagnostics


def test_diagnostics_does_not_import_streamlit():
    modules = [m.name for m in pkgutil.walk_packages(diagnostics.__path__, "diagnostics.")
               if not m.name.endswith("__main__")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = [m for m in sys.modules if m == 'streamlit' or m.startswith('streamlit.')]\n"
            "assert not bad, bad\nprint(len(%r))" % (modules,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 8

"""The dashboard's server process does not import torch to draw a first page: the sidebar's sample
catalogue and device panel read no torch (the job's worker does), so a cold session's first job is
not queued behind a torch import in the server (#19 item 2)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip()


def test_the_sidebar_and_the_sample_catalogue_import_no_torch():
    out = _fresh("import sys\n"
                 "import ui.background, ui.jobs, ui.sidebar, ui.state\n"
                 "from sample_models import SAMPLES, DEFAULT_SAMPLE\n"
                 "s = SAMPLES[DEFAULT_SAMPLE]\n"
                 "print(s.name, s.inputs[0].shape, SAMPLES['transformer'].inputs[0].high, 'torch' in sys.modules)")
    assert out == "cnn (8, 3, 32, 32) 1000 False"


def test_the_device_report_reads_torch_threads_only_where_torch_is_loaded():
    out = _fresh("import sys\n"
                 "from diagnostics.devices import device_report\n"
                 "a = device_report(import_torch=False)['cpu']['torch_threads']\n"
                 "loaded = 'torch' in sys.modules\n"
                 "import torch\n"
                 "b = device_report(import_torch=False)['cpu']['torch_threads']\n"
                 "print(a, loaded, b == torch.get_num_threads(), b)")
    none, loaded, same, _ = out.split()
    assert (none, loaded, same) == ("None", "False", "True")


def test_a_sample_is_built_from_its_module_when_asked():
    import torch

    from sample_models import SAMPLES, VOCAB, convnets, sequence

    model = SAMPLES["cnn"].build()
    assert type(model) is convnets.SmallCNN
    torch.manual_seed(0)
    a = SAMPLES["cnn"].build()
    torch.manual_seed(0)
    b = convnets.SmallCNN()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert sequence.VOCAB == VOCAB == SAMPLES["transformer"].num_classes
    assert SAMPLES["transformer"].build().__class__ is sequence.TinyTransformerLM


def test_every_view_module_imports_no_torch():
    """The views run in the server: the fix-trials view once imported measure.compare (torch with it) for the
    rounds an interval needs; only the slow launcher test, reading the server's memory maps, caught it."""
    out = _fresh("import importlib, pkgutil, sys\n"
                 "import ui.views\n"
                 "names = [m.name for m in pkgutil.iter_modules(ui.views.__path__)]\n"
                 "for n in names:\n"
                 "    importlib.import_module('ui.views.' + n)\n"
                 "print(len(names), 'torch' in sys.modules)")
    n, loaded = out.split()
    assert int(n) >= 15 and loaded == "False"

"""TorchScope's attach bootstrap: put first on PYTHONPATH by ``python -m diagnostics run``, so every
Python process of the job runs it at start-up (torchrun passes the environment to each rank).

Without TORCHSCOPE_ATTACH_DIR in the environment it only hands over to the next sitecustomize. With
it, it waits for the process to import torch (a finder on sys.meta_path that steps aside after
torch's module has run) and then installs the agent (diagnostics/attach/agent.py, loaded by its
path: nothing else of TorchScope is imported into the job). Any failure of ours is written into the
run folder and the process runs unprofiled; then the sitecustomize this one shadows (the
interpreter's or the environment's) runs, as it would without us.
"""

import os
import sys


def _torchscope_attach():
    run_dir = os.environ.get("TORCHSCOPE_ATTACH_DIR")
    if not run_dir:
        return
    import importlib.abc
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    agent_path = os.path.join(os.path.dirname(here), "agent.py")
    protocol_path = os.path.join(os.path.dirname(os.path.dirname(here)), "analyses", "attach", "protocol.py")

    def failed(where, exc):
        try:
            import json
            import traceback

            folder = os.path.join(run_dir, f"proc-{os.getpid()}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "errors.jsonl"), "a") as f:
                f.write(json.dumps({"where": where, "error": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc()[-4000:], "step": 0}) + "\n")
        except Exception:
            pass

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    def start(torch):
        try:
            protocol = load("_torchscope_attach_protocol", protocol_path)
            # -- hook point (issue 40, fix trials): a run folder with a trial.json gets the trial guest
            # (diagnostics/attach/fixes.py) instead of the agent: one candidate's fixes, timed steps, no profiler.
            if os.path.exists(os.path.join(run_dir, "trial.json")):
                trial = load("_torchscope_trial_protocol", os.path.join(
                    os.path.dirname(os.path.dirname(here)), "analyses", "trials", "protocol.py"))
                load("_torchscope_trial_guest", os.path.join(os.path.dirname(here), "fixes.py")).install(
                    torch, run_dir, trial)
                return
            # -- end of hook point
            agent = load("_torchscope_attach_agent", agent_path)
            agent.install(torch, run_dir, protocol)
        except Exception as e:  # ours: the job runs on, unprofiled
            failed("installing the hooks", e)

    if "torch" in sys.modules:
        start(sys.modules["torch"])
        return

    class TorchWatcher(importlib.abc.MetaPathFinder):
        """Finds nothing itself: when torch is imported, its real loader is wrapped so that the agent
        starts right after torch's package has run."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            try:
                sys.meta_path.remove(self)
            except ValueError:
                return None
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_attach(module):
                exec_module(module)
                start(module)

            spec.loader.exec_module = exec_then_attach
            return spec

    sys.meta_path.insert(0, TorchWatcher())


def _next_sitecustomize():
    """Run the sitecustomize this file shadows (the next one on sys.path), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its own errors surface as they would without us


try:
    _torchscope_attach()
except Exception:  # never the job's problem
    pass
_next_sitecustomize()

"""TorchScope engine: model specs, a worker-process runner, analyses, traces, store and charts.

Never imports streamlit, so it works the same from the dashboard, a notebook and the CLI::

    from diagnostics import ModelSpec, run
    result = run("summary", ModelSpec(source="sample", name="resnet"))
"""

from diagnostics.errors import TorchScopeError
from diagnostics.spec import InputSpec, ModelSpec

__all__ = ["InputSpec", "ModelSpec", "TorchScopeError", "run"]


def run(analysis: str, spec: ModelSpec, options: dict | None = None, **kwargs):
    """Run ``analysis`` on ``spec`` in a worker process and return its typed result (diagnostics.results;
    a plain dict for an analysis not converted yet); raises on failure."""
    from diagnostics.runner import Job, run_job

    outcome = run_job(Job(analysis, spec, options or {}), **kwargs)
    return outcome.unwrap()

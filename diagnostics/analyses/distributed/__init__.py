"""Distributed runs: launch DDP training of the model with torchrun and profile every rank
(distributed), or analyse a folder of per-rank traces (distributed_traces). The work is in
job.py (per-rank breakdown, collectives, stragglers), launch.py and rank_main.py; result.py declares
their typed result."""

from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.declare import COMM_KERNELS, Analysis, Option

BACKENDS = ("auto", "gloo", "nccl")
DIE_HOWS = ("exit", "kill")
MAX_NPROC = 64
#: A rank straggles when its median busy time is over the median of the other ranks by this fraction...
STRAGGLER_MARGIN = 0.20
#: ...and by at least this many milliseconds (keeps scheduler noise on tiny steps from counting).
STRAGGLER_MIN_EXCESS_MS = 10.0
#: Seconds the launch may take before it is stopped (below the job timeout, so the user reads which
#: ranks were stuck rather than a bare worker timeout).
DEFAULT_RUN_TIMEOUT_S = 480.0
DEFAULT_NPROC = 2
DEFAULT_STEPS = 5

_THRESHOLDS = (
    Option("straggler_margin", "float", STRAGGLER_MARGIN, "a rank straggles when its median busy time is over "
           "the other ranks' median by this fraction...", lo=0, flag="--margin"),
    Option("straggler_min_ms", "float", STRAGGLER_MIN_EXCESS_MS, "...and by at least this many ms", lo=0,
           flag="--min-excess-ms", unit="ms"),
    COMM_KERNELS,
)
DISTRIBUTED = Analysis(
    name="distributed", title="Distributed run (torchrun)", target="diagnostics.analyses.distributed.job:analyze",
    exclusive=True, timeout_s=600, result=DistributedResult, view="ui.views.distributed:show",
    report="diagnostics.render.charts.distributed:distributed_sections",
    description="DDP training through torchrun, profiled on every rank",
    options=(
        Option("nproc", "int", DEFAULT_NPROC, "processes (ranks) to launch with torchrun", lo=1, hi=MAX_NPROC),
        Option("steps", "int", DEFAULT_STEPS, "profiled training steps per rank", lo=1, hi=1000),
        Option("warmup", "int", 2, "steps before the profiled ones", lo=0, hi=1000),
        Option("backend", "choice", "auto", "process-group backend (auto: nccl when every process gets its own "
               "CUDA GPU, else gloo)", choices=BACKENDS),
        Option("pg_timeout_s", "float", 60.0, "process-group timeout: a collective waiting longer fails", gt=0,
               flag="", unit="s"),
        Option("run_timeout_s", "float", DEFAULT_RUN_TIMEOUT_S, "seconds the torchrun launch may take", gt=0,
               flag="", unit="s"),
        Option("straggler_rank", "int", None, "inject: this rank sleeps in every step", lo=0, optional=True,
               flag="--straggler-rank"),
        Option("straggler_sleep_ms", "float", 0.0, "inject: how long it sleeps", lo=0, flag="--straggler-ms", unit="ms"),
        Option("die_rank", "int", None, "inject: this rank exits at die_step", lo=0, optional=True, flag="--die-rank"),
        Option("die_step", "int", 1, "inject: the step at which die_rank exits", lo=0, flag="--die-step"),
        Option("die_how", "choice", "exit", "inject: exit (os._exit(3)) or kill (SIGKILL, as the OOM killer)",
               choices=DIE_HOWS, flag="--die-how"),
        Option("trace_dir", "path", None, "analyse this folder of per-rank traces instead of launching",
               optional=True, flag=""),
    ) + _THRESHOLDS,
)

DISTRIBUTED_TRACES = Analysis(
    name="distributed_traces", title="Distributed traces (folder)",
    target="diagnostics.analyses.distributed.job:analyze_folder", needs_model=False,
    result=DistributedResult, view="ui.views.distributed:show",
    report="diagnostics.render.charts.distributed:distributed_sections",
    description="a folder of per-rank torch.profiler traces (e.g. copied from several nodes)",
    options=(Option("trace_dir", "path", None, "a folder holding one trace per rank", required=True,
                    flag="--trace-dir"),) + _THRESHOLDS,
)

ANALYSES = (DISTRIBUTED, DISTRIBUTED_TRACES)

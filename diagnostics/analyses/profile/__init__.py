"""The profile analysis: a torch.profiler run of inference or training steps, latency measured
outside the profiler, and the operator / step / module / kernel / timeline views (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table

MODES = ("inference", "train")
OPTIMIZERS = ("sgd", "adamw")
ACTIVITIES = ("cpu", "cuda")
#: The schedule runs at most this many steps ((wait + warmup + active) x repeat).
MAX_PROFILED_STEPS = 200
MAX_LATENCY_ITERS = 10_000
TIMELINE_MAX_EVENTS = 4000

_OP_COLUMNS = (
    Column("calls", "count", "calls"), Column("self_cpu_ms", "ms", "self CPU"), Column("cpu_total_ms", "ms", "CPU total"),
    Column("self_device_ms", "ms", "self device"), Column("device_total_ms", "ms", "device total"),
    Column("self_cpu_pct", "percent", "self CPU share"), Column("self_device_pct", "percent", "self device share"),
    Column("mean_cpu_ms", "ms", "mean CPU per call"),
    Column("self_cpu_memory_bytes", "bytes", "self CPU memory"), Column("cpu_memory_bytes", "bytes", "CPU memory"),
    Column("self_device_memory_bytes", "bytes", "self device memory"),
    Column("device_memory_bytes", "bytes", "device memory"),
)

ANALYSIS = Analysis(
    name="profile", title="Profiler", target="diagnostics.analyses.profile.job:analyze", command="profile",
    exclusive=True, timeout_s=600, view="ui.views.profiler:show",
    report="diagnostics.render.charts.profiler:profile_sections",
    description="torch.profiler run: latency, operators, steps, modules, kernels, timeline and the Chrome trace",
    options=(
        Option("mode", "choice", "inference", "profile inference (eval + inference_mode) or training steps "
               "(forward, loss, backward, optimizer)", choices=MODES),
        Option("optimizer", "choice", "sgd", "optimizer of training steps", choices=OPTIMIZERS),
        Option("lr", "float", 0.01, "learning rate of training steps", gt=0, label="Learning rate"),
        Option("wait", "int", 1, "schedule: steps run without the profiler first", lo=0, hi=MAX_PROFILED_STEPS),
        Option("warmup", "int", 1, "schedule: profiled steps that are discarded (the profiler warms up)",
               lo=0, hi=MAX_PROFILED_STEPS),
        Option("active", "int", 3, "schedule: recorded steps per cycle", lo=1, hi=MAX_PROFILED_STEPS,
               flag="--steps"),
        Option("repeat", "int", 1, "schedule: cycles of wait + warmup + active", lo=1, hi=MAX_PROFILED_STEPS),
        Option("activities", "multi", None, "what to record (default: cpu, plus cuda when the model runs on a "
               "CUDA device)", choices=ACTIVITIES, optional=True),
        Option("record_shapes", "bool", True, "input shapes per operator (enables the by-shape table)"),
        Option("profile_memory", "bool", False, "memory allocated per operator"),
        Option("with_stack", "bool", False, "Python stacks in the trace (slower, larger trace)"),
        Option("with_modules", "bool", True, "a range per module's forward: per-module times and the module tree"),
        Option("latency_warmup", "int", 5, "untimed iterations before the latency is measured", lo=0,
               hi=MAX_LATENCY_ITERS),
        Option("latency_iters", "int", 30, "timed iterations outside the profiler", lo=1, hi=MAX_LATENCY_ITERS),
        Option("overhead_rounds", "int", 6, "rounds that measure the profiler's own cost: an unprofiled step and a "
               "profiled one (same settings) in a fresh random order each round; a 95% interval needs at least 6 "
               "(0: not measured)", lo=0, hi=1000),
        Option("roofline", "bool", True, "measure this machine's roofs (GEMM FLOP/s, copy bandwidth) and place each "
               "operator on the roofline; MFU of the step"),
        Option("timeline_max_events", "int", TIMELINE_MAX_EVENTS, "events drawn on the timeline at most",
               lo=10, hi=200_000),
    ),
    metrics=(
        Metric("latency_median_ms", "ms", "Latency (median)", "per step, measured outside the profiler", better="lower"),
        Metric("latency_p90_ms", "ms", "Latency p90", better="lower"),
        Metric("latency_p99_ms", "ms", "Latency p99", better="lower"),
        Metric("latency_std_ms", "ms", "Latency std", better="lower"),
        Metric("throughput_samples_per_s", "per_s", "Throughput", "samples per second at the median latency", better="higher"),
        Metric("profiled_steps", "count", "Profiled steps"),
        Metric("step_time_mean_ms", "ms", "Profiled step time (mean)", "inside the profiler: includes its overhead", better="lower"),
        Metric("profiler_overhead_pct", "percent", "Profiler overhead",
               "a profiled step over an unprofiled one, minus 1: both timed in the same interleaved rounds (the "
               "geometric mean of the rounds' ratios)", better="lower",
               interval=("profiler_overhead_ci_low", "profiler_overhead_ci_high")),
        Metric("profiler_overhead_ci_low", "percent", "Profiler overhead interval, low"),
        Metric("profiler_overhead_ci_high", "percent", "Profiler overhead interval, high"),
        Metric("mfu", "fraction", "MFU", "model FLOPs per step / median latency / the measured GEMM peak", better="higher"),
        Metric("model_flops_per_step", "flop", "Model FLOPs per step", "FlopCounterMode, one step"),
        Metric("peak_flops", "flop_per_s", "Measured GEMM peak"),
        Metric("bandwidth_bytes_per_s", "bytes_per_s", "Measured memory bandwidth"),
        Metric("roofline_headroom_ms", "ms", "Time above the roofs per step", "sum over ops of time minus time "
               "at the roof", better="lower"),
        Metric("self_cpu_total_ms", "ms", "Self CPU time (sum)", better="lower"),
        Metric("self_device_total_ms", "ms", "Self device time (sum)", better="lower"),
        Metric("kernel_time_ms", "ms", "GPU kernel time", better="lower"),
        Metric("tensor_core_kernel_pct", "percent", "Kernel time on Tensor Cores", better="higher"),
        Metric("peak_device_memory_bytes", "bytes", "Peak device memory", better="lower"),
        Metric("profile_wall_s", "s", "Profiler wall time"),
        Metric("batch_size", "count", "Batch size"),
    ),
    tables=(
        Table("roofline", "Roofline per operator", (
            Column("time_ms", "ms", "time per step"), Column("flops", "flop", "FLOPs per step"),
            Column("bytes", "bytes", "bytes moved per step"), Column("achieved_tflops", "number", "achieved TFLOP/s"),
            Column("intensity", "number", "FLOP per byte"), Column("roof_ms", "ms", "time at the roof"),
            Column("headroom_ms", "ms", "headroom"))),
        Table("operators", "Operators (summed over the profiled steps)", _OP_COLUMNS),
        Table("operators_by_shape", "Operators by input shape", _OP_COLUMNS),
        Table("steps", "Steps", (Column("step_ms", "ms", "step"), Column("zero_grad_ms", "ms", "zero_grad"),
                                 Column("forward_ms", "ms", "forward"), Column("backward_ms", "ms", "backward"),
                                 Column("optimizer_ms", "ms", "optimizer"), Column("other_ms", "ms", "other"))),
        Table("device_split", "Step split (kernel / memcpy / memset / runtime / CPU)",
              tuple(Column(f"{c}_ms", "ms", c) for c in ("window", "kernel", "memcpy", "memset", "runtime",
                                                         "cpu_exec", "other"))),
        Table("modules", "Modules", (Column("calls", "count", "calls"), Column("forward_ms", "ms", "forward"),
                                     Column("forward_self_ms", "ms", "forward self"),
                                     Column("backward_ms", "ms", "backward"),
                                     Column("backward_self_ms", "ms", "backward self"))),
        Table("kernels", "GPU kernels", (Column("calls", "count", "calls"), Column("total_us", "us", "total"),
                                         Column("mean_us", "us", "mean"), Column("max_us", "us", "max"),
                                         Column("min_us", "us", "min"),
                                         Column("pct_of_kernel_time", "percent", "share of kernel time"),
                                         Column("occupancy_pct", "percent", "achieved occupancy"))),
    ),
)

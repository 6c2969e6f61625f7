"""Each rule driven by real models: one small nn.Module that passes it and one that fails (or warns)
it, run through ``collect_facts`` and the rule itself (test_checklist_rules.py does the same on
hand-written facts).

Models that serve several rules are collected once per module (fixtures below). Rules that need
no timing run with ``skip_measured``. CUDA-only rules are asserted not applicable here (with a
reason naming CUDA / the GPU), and have a pass/fail pair that runs where a GPU is present.

Sides no real small model can drive (said again at their tests):
* ``saved_activations`` warns only above 30% of the device's memory; on CPU that is 30% of RAM, so
  the failing side evaluates a real model's measured bytes against a smaller pretend device;
* ``communication`` needs NCCL kernels from several GPUs (on one GPU it is not applicable),
  ``data_parallel``'s fail needs nn.DataParallel over more than one GPU, ``peak_memory``'s fail
  needs 90% of a GPU's memory: those sides are left to the hand-written facts.
Timing rules compare in interleaved rounds (measure.compare) and act only on what the interval's
low end says, so their passing side holds on a busy machine without measuring again.
"""

from __future__ import annotations

import msgspec
import pytest
import torch
from torch import nn

from diagnostics.analyses.checklist.facts import collect_facts
from diagnostics.analyses.checklist.rules import RULES, Finding
from diagnostics.intake import default_loss

from tests.checklist.test_checklist_facts import FAST, loaded_of

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
STATIC = {**FAST, "skip_measured": True}  # module tree and one traced forward only


def loaded_on(model, *inputs, loss=default_loss):
    """``loaded_of`` on the inputs' device and with their dtypes (it builds a CPU spec)."""
    from dataclasses import replace

    from diagnostics.spec import InputSpec

    loaded = loaded_of(model, *inputs, loss=loss)
    specs = tuple(InputSpec(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in inputs)
    device = inputs[0].device
    name = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
    return replace(loaded, spec=replace(loaded.spec, device=name), input_specs=specs)


def facts_of(model, *inputs, loss=default_loss, **options) -> dict:
    return collect_facts(loaded_on(model, *inputs, loss=loss), {**FAST, **options})


def static_of(model, *inputs, **options) -> dict:
    return collect_facts(loaded_on(model, *inputs), {**STATIC, **options})


def rule(rule_id: str, facts: dict) -> Finding:
    return next(r for r in RULES if r.id == rule_id)(facts)


def expect(rule_id: str, facts: dict, status: str, fragment: str) -> Finding:
    f = rule(rule_id, facts)
    assert f.status == status, (rule_id, f.status, f.evidence, facts.errors)
    assert fragment in f.evidence, (rule_id, f.evidence)
    if status in ("warn", "fail"):
        assert f.suggestion
    return f


# ----------------------------------------------------------------------------- models
def mlp(widths=(64, 128, 128, 16), act=lambda: nn.ReLU(inplace=True), dropout=0.1) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers += [act(), nn.Dropout(dropout)] if dropout else [act()]
    return nn.Sequential(*layers)


class Heavy(nn.Module):
    """A compute-bound step (two 768-wide matmuls at batch 256, ~ms each): few ops, no dropout."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(256, 768), nn.Linear(768, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TinyOps(nn.Module):
    """Hundreds of elementwise ops (a few µs each) on a 4x8 tensor per forward: launch-bound."""

    def __init__(self, n: int = 150):
        super().__init__()
        self.fc, self.n = nn.Linear(8, 8), n

    def forward(self, x):
        x = self.fc(x)
        for _ in range(self.n):
            x = torch.neg(x)
        return x


class RowLoop(nn.Module):
    """A Python loop over the batch: one select and one small linear per sample."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.stack([self.fc(x[i]) for i in range(x.shape[0])])


class Transposes(nn.Module):
    """Copies the activation to a new layout three times per forward (transpose + contiguous)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(96, 8)

    def forward(self, x):  # x: [B, 96, 96]
        for _ in range(3):
            x = x.transpose(1, 2).contiguous()
        return self.fc(x.mean(1))


def conv_net(bn_after_conv: bool = True) -> nn.Sequential:
    mid = [nn.BatchNorm2d(8), nn.ReLU()] if bn_after_conv else [nn.ReLU(), nn.BatchNorm2d(8)]
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *mid, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8))


FAST_DATASET = """
import torch
class Ready(torch.utils.data.Dataset):
    def __init__(self): self.items = torch.randn(64, 256)
    def __len__(self): return 64
    def __getitem__(self, i): return self.items[i]
def build_dataset():
    return Ready()
"""
SLOW_DATASET = FAST_DATASET.replace("def __getitem__(self, i): return", "def __getitem__(self, i):\n"
                                    "        import time; time.sleep(0.01); return")
GOOD_LOADER = {"batch_size": 8, "num_workers": 1, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": True}


# ----------------------------------------------------------------------------- shared facts
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Timing rules compare medians of a few calls: two OpenMP threads on a 2-core machine that
    other jobs share spin against each other (a 4 ms matmul took 32 ms), one thread does not."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


@pytest.fixture(scope="module")
def healthy():
    """A ReLU MLP (in place, widths multiples of 8, Dropout in training mode) at batch 32 with a
    well-described DataLoader: passes the model-design, memory and data-pipeline rules."""
    torch.manual_seed(0)
    return facts_of(mlp(), torch.randn(32, 64), dataloader=GOOD_LOADER)


def heavy_facts(dataset_path) -> dict:
    torch.manual_seed(0)
    return facts_of(Heavy(), torch.randn(256, 256), iters=5,
                    dataloader={"batch_size": 8, "num_workers": 0}, dataset_path=str(dataset_path))


@pytest.fixture(scope="module")
def ready_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "ready_ds.py"
    path.write_text(FAST_DATASET)
    return path


@pytest.fixture(scope="module")
def heavy(ready_dataset):
    """Compute-bound step, a DataLoader over precomputed tensors: loader time, batch size and
    inference mode have nothing to gain. More timing iterations for steadier medians."""
    return heavy_facts(ready_dataset)


# ----------------------------------------------------------------------------- data pipeline
def test_dataloader_time(heavy, ready_dataset, tmp_path):
    expect("dataloader_time", heavy, "pass", "of the step (max 5.0%)")
    path = tmp_path / "slow_ds.py"
    path.write_text(SLOW_DATASET)
    slow = facts_of(nn.Linear(256, 16), torch.randn(8, 256), skip_measured=False,
                    dataloader={"batch_size": 4, "num_workers": 0}, dataset_path=str(path))
    expect("dataloader_time", slow, "fail", "loading a batch took")


def test_num_workers(healthy):
    expect("num_workers", healthy, "pass", "num_workers=1")
    expect("num_workers", static_of(nn.Linear(8, 8), torch.randn(8, 8), dataloader={"num_workers": 0}),
           "warn", "num_workers=0")
    many = static_of(nn.Linear(8, 8), torch.randn(8, 8), dataloader={"num_workers": 4096})
    expect("num_workers", many, "warn", "exceeds the")


def test_prefetch(healthy):
    expect("prefetch", healthy, "pass", "prefetch_factor=2, persistent_workers=True")
    bad = static_of(nn.Linear(8, 8), torch.randn(8, 8),
                    dataloader={**GOOD_LOADER, "prefetch_factor": 1, "persistent_workers": False})
    f = expect("prefetch", bad, "warn", "prefetch_factor=1")
    assert "persistent_workers=False" in f.evidence


def test_pin_memory_is_cuda_only(healthy):
    expect("pin_memory", healthy, "not_applicable", "no CUDA")  # the facts are a CPU run, GPU or not


@needs_cuda
def test_pin_memory_on_cuda():
    m, x = nn.Linear(8, 8).cuda(), torch.randn(8, 8, device="cuda")
    expect("pin_memory", static_of(m, x, dataloader=GOOD_LOADER), "pass", "pin_memory=True")
    expect("pin_memory", static_of(m, x, dataloader={**GOOD_LOADER, "pin_memory": False}), "warn", "pin_memory=False")


# ----------------------------------------------------------------------------- model design
def test_hidden_activations(healthy):
    expect("hidden_activations", healthy, "pass", "ReLU x2")
    tanh = static_of(mlp(act=nn.Tanh), torch.randn(8, 64))
    expect("hidden_activations", tanh, "warn", "2 Sigmoid/Tanh activations in hidden layers (1, 4)")


def test_layer_widths(healthy):
    expect("layer_widths", healthy, "pass", "all 4 inner widths are multiples of 8")
    odd = static_of(mlp(widths=(60, 100, 50, 10)), torch.randn(8, 60))
    expect("layer_widths", odd, "fail", "4 of 4 inner widths are not multiples of 8 (0.out=100")


def test_weight_init(healthy):
    expect("weight_init", healthy, "pass", "weight scale std x sqrt(fan_in) in [0.5")
    big = mlp()
    with torch.no_grad():
        big[0].weight.mul_(10)
    expect("weight_init", static_of(big, torch.randn(8, 64)), "warn", "1 of 3 layers have weight std x sqrt(fan_in)")


def test_dropout_bn_mode(healthy):
    expect("dropout_bn_mode", healthy, "pass", "all Dropout/BatchNorm layers are in training mode")
    expect("dropout_bn_mode", static_of(mlp(), torch.randn(8, 64), purpose="inference"), "fail",
           "for inference, 2 Dropout/BatchNorm layers are in training mode")
    expect("dropout_bn_mode", static_of(mlp().eval(), torch.randn(8, 64)), "warn", "the model is in eval mode")
    expect("dropout_bn_mode", static_of(mlp().eval(), torch.randn(8, 64), purpose="inference"), "pass",
           "in eval mode")


def test_gradients_finite(healthy):
    expect("gradients_finite", healthy, "pass", "gradients of all 3 layers are finite")
    nan = mlp()
    with torch.no_grad():
        nan[0].bias[0] = float("nan")
    expect("gradients_finite", facts_of(nan, torch.randn(16, 64)), "fail", "layers got NaN/Inf gradients")


def test_gradient_flow(healthy):
    from sample_models.mlps import DeepSigmoidMLP

    expect("gradient_flow", healthy, "pass", "all 3 layers healthy")
    torch.manual_seed(0)
    expect("gradient_flow", facts_of(DeepSigmoidMLP(), torch.randn(16, 64)), "fail", "vanishing gradients in")


def test_dead_units(healthy):
    expect("dead_units", healthy, "pass", "of 256 ReLU units output zero")
    dead = mlp()
    with torch.no_grad():
        dead[0].bias.fill_(-100.0)  # every unit of the first layer is negative for every sample
    f = expect("dead_units", static_of(dead, torch.randn(16, 64)), "warn", "of 256 ReLU units output zero")
    assert f.numbers["dead"] >= 128


def test_data_parallel(healthy):
    expect("data_parallel", healthy, "pass", "not wrapped in nn.DataParallel")
    dp = static_of(nn.DataParallel(mlp()), torch.randn(8, 64))
    # Over more than one GPU it fails: that needs two GPUs (hand-written facts cover it).
    n = torch.cuda.device_count()
    if n == 0:
        expect("data_parallel", dp, "warn", "nn.DataParallel over no GPU (it just calls the module)")
    elif n == 1:
        expect("data_parallel", dp, "warn", "nn.DataParallel over one device only")
    else:
        expect("data_parallel", dp, "fail", f"nn.DataParallel over {n} devices")


def test_ddp_backend(tmp_path):
    import torch.distributed as dist

    expect("ddp_backend", static_of(nn.Linear(8, 8), torch.randn(8, 8)), "not_applicable", "not wrapped")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
        expect("ddp_backend", static_of(ddp, torch.randn(8, 8)), "pass", "DDP with backend 'gloo'")
    finally:
        dist.destroy_process_group()


@needs_cuda
def test_ddp_backend_gloo_on_cuda_fails(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8).cuda())
        expect("ddp_backend", static_of(ddp, torch.randn(8, 8, device="cuda")), "fail", "DDP on CUDA with backend")
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- memory
def test_saved_activations(healthy):
    f = expect("saved_activations", healthy, "pass", "autograd saves")
    # Warning needs saved activations above 30% of the device's memory: on CPU, 30% of the RAM. No
    # small model gets there, so the real measured bytes are judged against a pretend device twice
    # their size.
    assert f.numbers["saved_bytes"] > 0
    small_device = msgspec.structs.replace(
        healthy, env=msgspec.structs.replace(healthy.env, device_memory_bytes=2 * f.numbers["saved_bytes"]))
    expect("saved_activations", small_device, "warn", "autograd saves")


def test_inplace_activations(healthy):
    expect("inplace_activations", healthy, "pass", "2 of 2 activations run in place")
    expect("inplace_activations", static_of(mlp(act=nn.ReLU), torch.randn(8, 64)), "warn",
           "none of 2 activations run in place")


# ----------------------------------------------------------------------------- compute
def test_launch_bound(heavy):
    expect("launch_bound", heavy, "pass", "operators per step")
    expect("launch_bound", facts_of(TinyOps(), torch.randn(4, 8)), "warn", "launch-bound")


def test_torch_compile(healthy):
    if not healthy.env.cxx_compiler:
        expect("torch_compile", healthy, "not_applicable", "C++ compiler")
    else:
        expect("torch_compile", healthy, "warn", "the model is not compiled")
    scripted = torch.jit.script(mlp())
    expect("torch_compile", static_of(scripted, torch.randn(8, 64)), "pass", "TorchScript")


def test_channels_last():
    x = torch.randn(2, 3, 8, 8)
    expect("channels_last", static_of(conv_net(), x), "warn", "1 Conv2d layers run in NCHW")
    cl = conv_net().to(memory_format=torch.channels_last)
    expect("channels_last", static_of(cl, x.to(memory_format=torch.channels_last)), "pass",
           "weights and input are channels_last")
    expect("channels_last", static_of(mlp(), torch.randn(8, 64)), "not_applicable", "no 2-D convolutions")


def test_batch_size(heavy):
    f = expect("batch_size", heavy, "pass", "at batch 256")
    low, high = f.numbers["throughput_gain_ci"]  # twice the interleaved speed-up's interval
    assert low <= f.numbers["throughput_gain_2x"] <= high and low <= 1.2
    # a tiny layer at batch 4: "warn" exactly when the doubling's interval is wholly above x1.2 scaled by the
    # A/A control's high end (a busy machine's noise: [1.64, 5.80] read "pass" beside a wide control)
    facts = facts_of(nn.Linear(8, 8), torch.randn(4, 8))
    f = [r for r in RULES if r.id == "batch_size"][0](facts)
    low = f.numbers["throughput_gain_ci"][0]
    noise = (facts.measured.batch_probe.control_ci or [None, None])[1] or 1.0
    assert (f.status == "warn") == (low > 1.2 * max(1.0, noise)), (f.status, f.evidence, noise)
    assert ("more than x1.2" in f.evidence) == (f.status == "warn")


def test_batch_multiple_of_8_matters_on_cuda_only():
    from tests.checklist.sample_facts import healthy, set_path

    odd = set_path(healthy(), "batch_size", 12)  # healthy facts: a flat throughput (x1.0) when doubled
    expect("batch_size", odd, "warn", "batch size 12 is not a multiple of 8")
    expect("batch_size", set_path(odd, "env.device_type", "cpu"), "pass", "at batch 64")


def test_inference_mode(heavy):
    f = expect("inference_mode", heavy, "pass", "interleaved rounds)")
    low, high = f.numbers["speedup_ci"]
    assert low <= f.numbers["speedup"] <= high and low <= 1.1  # nothing to gain beyond the noise
    # Dropout in training mode on a wide activation costs a random mask per call; eval() skips it.
    drops = nn.Sequential(nn.Linear(64, 2048), *[nn.Dropout(0.5) for _ in range(4)], nn.Linear(2048, 8))
    expect("inference_mode", facts_of(drops, torch.randn(256, 64)), "warn", "eval() + inference_mode")


# ----------------------------------------------------------------------------- deployment
def test_conv_bn_fusion():
    x = torch.randn(2, 3, 8, 8)
    expect("conv_bn_fusion", static_of(conv_net(), x), "warn", "1 Conv -> BatchNorm pairs can be fused for inference (e.g. 0 -> 1)")
    expect("conv_bn_fusion", static_of(conv_net(bn_after_conv=False), x), "pass", "no BatchNorm directly follows")
    expect("conv_bn_fusion", static_of(mlp(), torch.randn(8, 64)), "not_applicable", "no BatchNorm")


# ----------------------------------------------------------------------------- CUDA only
CUDA_ONLY = {  # rule -> a word of its not-applicable reason on CPU
    "communication": "CUDA", "gpu_utilization": "CUDA", "tensor_cores": "CUDA", "peak_memory": "CUDA",
    "memory_growth": "CUDA", "cudnn_benchmark": "CUDA", "tf32": "CUDA", "mixed_precision": "CUDA",
    "pin_memory": "CUDA", "sync_points": "no GPU",
}


@pytest.mark.parametrize("rule_id", sorted(CUDA_ONLY))
def test_cuda_only_rules_do_not_apply_on_cpu(rule_id, healthy):
    facts = healthy
    if rule_id == "cudnn_benchmark":  # it first needs a convolution to care about
        facts = static_of(conv_net(), torch.randn(2, 3, 8, 8))
    expect(rule_id, facts, "not_applicable", CUDA_ONLY[rule_id])


class TwelveItemsPerForward(nn.Module):
    """Reads a value on the host in every forward, twelve times."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        for i in range(12):
            if y[i % y.shape[0]].abs().max().item() > 1e9:
                y = y * 0
        return y


def test_sync_points_on_cpu_are_not_applicable_even_with_host_reads():
    facts = facts_of(TwelveItemsPerForward(), torch.randn(16, 8))
    assert facts.measured.profile.sync_per_step["aten::item"] == 12  # counted, not blamed
    expect("sync_points", facts, "not_applicable", "no GPU (CUDA): host reads such as .item() cost no")


@needs_cuda
def test_sync_points_on_cuda():
    expect("sync_points", facts_of(nn.Linear(8, 8).cuda(), torch.randn(16, 8, device="cuda")), "pass",
           "0 CPU-GPU sync points per step")
    dirty = facts_of(TwelveItemsPerForward().cuda(), torch.randn(16, 8, device="cuda"))
    assert dirty.measured.profile.sync_per_step["aten::item"] == 12
    expect("sync_points", dirty, "fail", "CPU-GPU sync points per step")


@pytest.fixture(scope="module")
def cuda_heavy():
    torch.manual_seed(0)
    # Big enough that the GPU, not the host's launches, sets the step time even on an H100
    # (at 2048 a step's kernels covered 44 to 60 % of it there).
    return facts_of(nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda(),
                    torch.randn(8192, 4096, device="cuda"))


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        import time

        time.sleep(0.005)  # the GPU idles while the host sleeps
        return self.fc(x)


@needs_cuda
def test_gpu_utilization_on_cuda(cuda_heavy):
    expect("gpu_utilization", cuda_heavy, "pass", "a GPU kernel was running")
    expect("gpu_utilization", facts_of(Sleepy().cuda(), torch.randn(8, 8, device="cuda")), "warn",
           "a GPU kernel was running")


@needs_cuda
def test_tensor_cores_and_mixed_precision_on_cuda(cuda_heavy):
    if cuda_heavy.env.compute_capability < 7:
        pytest.skip("no Tensor Cores on this GPU")
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32 = facts_of(nn.Linear(1024, 1024).cuda(), torch.randn(1024, 1024, device="cuda"))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    expect("tensor_cores", fp32, "fail", "but no Tensor Core kernel was launched")
    expect("mixed_precision", fp32, "warn", "all parameters are float32")
    bf16 = facts_of(nn.Linear(1024, 1024).cuda().bfloat16(), torch.randn(1024, 1024, device="cuda").bfloat16())
    expect("tensor_cores", bf16, "pass", "Tensor Core kernel kinds ran")
    expect("mixed_precision", bf16, "pass", "of parameters are in 16-bit")


@needs_cuda
def test_tf32_on_cuda():
    m, x = nn.Linear(8, 8).cuda(), torch.randn(8, 8, device="cuda")
    was = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        on = static_of(m, x)
        torch.backends.cuda.matmul.allow_tf32 = False
        off = static_of(m, x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    if on.env.compute_capability < 8:
        expect("tf32", on, "not_applicable", "no TF32")
        return
    expect("tf32", on, "pass", "TF32 on")
    expect("tf32", off, "warn", "TF32 matmuls are off")


@needs_cuda
def test_cudnn_benchmark_on_cuda():
    m, x = conv_net().cuda(), torch.randn(2, 3, 8, 8, device="cuda")
    was = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        on = static_of(m, x)
        torch.backends.cudnn.benchmark = False
        off = static_of(m, x)
    finally:
        torch.backends.cudnn.benchmark = was
    expect("cudnn_benchmark", on, "pass", "cudnn.benchmark is on")
    expect("cudnn_benchmark", off, "warn", "cudnn.benchmark is off")


class Leaky(nn.Module):
    """Keeps every output alive across steps: 2 MiB more allocated per step."""

    def __init__(self):
        super().__init__()
        self.fc, self.kept = nn.Linear(512, 1024), []

    def forward(self, x):
        y = self.fc(x)
        self.kept.append(y)
        return y


@needs_cuda
def test_memory_growth_and_peak_memory_on_cuda(cuda_heavy):
    expect("memory_growth", cuda_heavy, "pass", "allocated memory grew")
    expect("peak_memory", cuda_heavy, "pass", "device memory")
    leak = facts_of(Leaky().cuda(), torch.randn(512, 512, device="cuda"))
    expect("memory_growth", leak, "fail", "allocated memory grew")


@needs_cuda
def test_communication_on_one_gpu_is_not_distributed(cuda_heavy):
    expect("communication", cuda_heavy, "not_applicable", "not distributed")


# ----------------------------------------------------------------------------- fixed: gates are not hidden activations
class SqueezeExcite(nn.Module):
    """MobileNet/EfficientNet-style block: a Sigmoid gate multiplied into the features."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.act = nn.SiLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.relu, self.expand = nn.Conv2d(c, 8, 1), nn.ReLU(), nn.Conv2d(8, c, 1)
        self.gate = nn.Sigmoid()
        self.head = nn.Linear(c, 8)

    def forward(self, x):
        x = self.act(self.conv(x))
        x = x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))
        return self.head(x.mean((2, 3)))


class GatedUnit(nn.Module):
    """A GLU/GRU-style gate: tanh(a) * sigmoid(b), then a Linear."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 8)
        self.tanh, self.sigmoid = nn.Tanh(), nn.Sigmoid()

    def forward(self, x):
        return self.out(self.tanh(self.a(x)) * self.sigmoid(self.b(x)))


def test_sigmoid_and_tanh_gates_are_not_hidden_activations():
    se = static_of(SqueezeExcite(), torch.randn(2, 3, 8, 8))
    assert se.forward.hidden_saturating == ()
    expect("hidden_activations", se, "pass", "Sigmoid x1")
    glu = static_of(GatedUnit(), torch.randn(4, 16))
    expect("hidden_activations", glu, "pass", "Tanh x1")


def test_a_sigmoid_feeding_a_layer_through_pooling_or_dropout_is_hidden():
    lenet = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Tanh(), nn.AvgPool2d(2), nn.Conv2d(8, 16, 3), nn.Sigmoid(),
                          nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, 8))
    f = static_of(lenet, torch.randn(2, 1, 8, 8))
    assert f.forward.hidden_saturating == ("1", "4")
    expect("hidden_activations", f, "warn", "2 Sigmoid/Tanh activations in hidden layers (1, 4)")
    # as an attention input
    attn = nn.MultiheadAttention(16, 2, batch_first=True)

    class TanhAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.tanh, self.attn = nn.Linear(16, 16), nn.Tanh(), attn

        def forward(self, x):
            h = self.tanh(self.fc(x))
            return self.attn(h, h, h)[0]

    expect("hidden_activations", static_of(TanhAttention(), torch.randn(2, 4, 16)), "warn", "(tanh)")


def test_conv_then_inplace_relu_then_batchnorm_is_no_fusable_pair():
    """An in-place ReLU returns the conv's output tensor: the BN after it still reads a ReLU output."""
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.BatchNorm2d(8))
    expect("conv_bn_fusion", static_of(m, torch.randn(2, 3, 8, 8)), "pass", "no BatchNorm directly follows")


# ----------------------------------------------------------------------------- fixed: no second copy of the model
class HoldsALock(nn.Module):
    """A model with an attribute copy.deepcopy cannot copy (locks, open files, CUDA streams...)."""

    def __init__(self):
        import threading

        super().__init__()
        self.fc, self.lock = nn.Linear(8, 8), threading.Lock()

    def forward(self, x):
        with self.lock:
            return self.fc(x)


def test_the_probes_run_on_the_model_itself_and_put_it_back():
    m = HoldsALock()
    facts = facts_of(m, torch.randn(16, 8))  # a deep copy raised TypeError: cannot pickle '_thread.lock'
    assert facts.measured.train_step.median_s > 0 and not facts.errors
    # what the probes change comes back: values, tensor objects, gradients, per-module modes
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 8))
    net.train()
    net[1].eval()  # a frozen BatchNorm inside a training model
    default_loss(net(torch.randn(16, 8))).backward()
    params = list(net.parameters())
    before = {k: v.clone() for k, v in net.state_dict().items()}
    grads = [p.grad for p in params]
    grad_values = [g.clone() for g in grads]
    facts_of(net, torch.randn(16, 8))
    assert list(net.parameters()) == params and all(a is b for a, b in zip(net.parameters(), params))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is g and torch.equal(g, v) for p, g, v in zip(params, grads, grad_values))
    assert net.training and not net[1].training and net[3].training


@needs_cuda
def test_peak_memory_counts_the_weights_once_on_cuda():
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    m = nn.Linear(4096, 4096).cuda()  # 64 MiB of weights
    weights = sum(p.numel() * p.element_size() for p in m.parameters())
    facts = facts_of(m, torch.randn(8, 4096, device="cuda"))
    # weights + their gradients + a few small activations: about twice the weights, not three times
    assert facts.measured.peak_bytes - base < 2.5 * weights


# ----------------------------------------------------------------------------- rules added with the development checklist
class Redundant(nn.Module):
    """Every kind of layer that adds nothing, wired in forward."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)  # no nonlinearity between
        self.bn1, self.bn2 = nn.BatchNorm1d(16), nn.BatchNorm1d(16)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.drop = nn.Dropout(0.0)
        self.head = nn.Linear(16, 8)

    def forward(self, x):
        x = self.bn2(self.bn1(self.fc2(self.fc1(x))))
        return self.head(self.drop(self.relu2(self.relu1(x))))


def test_redundant_layers(healthy):
    expect("redundant_layers", healthy, "pass", "no Linear -> Linear without a nonlinearity")
    f = expect("redundant_layers", static_of(Redundant(), torch.randn(8, 16)), "warn", "3 layers add nothing")
    # a Dropout(p=0) (a config's switched-off dropout) is an identity: said, not counted
    for part in ("1 Dropout(p=0) (drop) are identities, harmless", "fc1 -> fc2 (Linear 16->32 then Linear 32->16",
                 "bn1 -> bn2", "relu1 -> relu2 (ReLU applied twice"):
        assert part in f.evidence, (part, f.evidence)


def test_redundant_layers_leaves_bottlenecks_and_nonlinear_stacks_alone():
    # a low-rank factorisation (256 -> 16 -> 256) is smaller than one 256 -> 256 Linear: on purpose
    low_rank = nn.Sequential(nn.Linear(256, 16), nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 8))
    expect("redundant_layers", static_of(low_rank, torch.randn(4, 256)), "pass", "no Linear -> Linear")
    # a functional activation between two Linears is a nonlinearity, a residual add breaks the chain
    expect("redundant_layers", static_of(Heavy(), torch.randn(4, 256)), "pass", "no Linear -> Linear")


class FanOut(nn.Module):
    """fc1's output also feeds a residual, and bn1's feeds a second branch: neither pair can be merged."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.bn1, self.bn2 = nn.BatchNorm1d(16), nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = h + self.fc2(h)  # residual: fc1's output is used twice
        b = self.bn1(torch.relu(h))
        return self.head(torch.relu(self.bn2(b) + b))


class Shared(nn.Module):
    """One Linear applied twice (ALBERT-style weight sharing), and two Linears tied to one weight."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(16, 16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.b.weight = self.a.weight
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.block(self.block(x)))
        return self.head(torch.relu(self.b(self.a(x))))


def test_redundant_layers_leave_fan_out_and_shared_weights_alone():
    """Merging two Linears needs the middle tensor to go nowhere else and the two weights to be
    separate: an output that also feeds a residual, a layer applied twice and tied weights are not
    layers that add nothing."""
    expect("redundant_layers", static_of(FanOut(), torch.randn(8, 16)), "pass", "no Linear -> Linear")
    expect("redundant_layers", static_of(Shared(), torch.randn(8, 16)), "pass", "no Linear -> Linear")


def test_tensor_copies(healthy):
    expect("tensor_copies", healthy, "pass", "0 layout copies per step")
    f = expect("tensor_copies", facts_of(Transposes(), torch.randn(8, 96, 96)), "warn", "3 layout copies per step")
    assert f.numbers["fraction"] > 0.10


def test_python_loops(healthy):
    expect("python_loops", healthy, "pass", "0 indexing / scalar-read ops per step")
    f = expect("python_loops", facts_of(RowLoop(), torch.randn(64, 16)), "warn", "aten::select 64")
    assert "1 per sample at batch 64" in f.evidence
    # ``for row in x`` selects through one unbind
    class Rows(RowLoop):
        def forward(self, x):
            return torch.stack([self.fc(row) for row in x])

    expect("python_loops", facts_of(Rows(), torch.randn(64, 16)), "warn", "aten::select (unbind) 64")


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet", "transformer", "lstm"])
def test_healthy_samples_pass_the_new_rules(name):
    from diagnostics.intake import load_model
    from diagnostics.spec import ModelSpec

    facts = collect_facts(load_model(ModelSpec(name=name)), {**FAST, "purpose": "training"})
    for rule_id in ("redundant_layers", "tensor_copies", "python_loops"):
        f = rule(rule_id, facts)
        assert f.status == "pass", (name, rule_id, f.evidence)


# ----------------------------------------------------------------------------- torch.compile
def test_graph_breaks_on_a_model_that_breaks_and_one_that_does_not():
    from sample_models.mlps import GraphBreakMLP

    torch.manual_seed(0)
    f = expect("graph_breaks", facts_of(GraphBreakMLP(), torch.randn(32, 64), skip_measured=False), "warn",
               "2 graph break(s) split the forward into 3 graphs (mlps.py:")
    assert "Compile page" in f.suggestion and [b["count"] for b in f.numbers["breaks"]] == [1, 1]
    expect("graph_breaks", facts_of(mlp(), torch.randn(32, 64), skip_measured=False), "pass",
           "captures the forward as 1 graph(s) with no break")

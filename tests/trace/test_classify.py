"""The classifiers, each on real-schema event names (the recorded traces in tests/data and names
read from torch.profiler / Kineto / NCCL), and a guard that none is defined a second time."""

import ast
import json
import re
from pathlib import Path

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import classify as C
from diagnostics.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
GPU = DATA / "traces" / "gpu_small.json"
PAIR = DATA / "distributed" / "pair"


# ---- steps -----------------------------------------------------------------------------------

def test_step_pattern():
    assert C.step_number("ProfilerStep#0") == 0 and C.step_number("ProfilerStep#12") == 12
    for name in ("ProfilerStep#", "ProfilerStep#1a", "xProfilerStep#1", "ProfilerStep#1 ", "profilerstep#1",
                 "Optimizer.step#SGD.step", ""):
        assert C.step_number(name) is None, name
    assert C.step_number(C.step_label(7)) == 7


def test_step_mask_on_a_recorded_gpu_trace():
    t = load_trace(GPU)
    names = t.strings("name", C.step_mask(t)).tolist()
    assert names == ["ProfilerStep#1", "ProfilerStep#2"]  # host ranges only, whatever mirrors them


def test_step_mask_leaves_the_gpu_mirror_of_a_step_out(tmp_path):
    evs = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 0, "dur": 9},
           {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4", "pid": 0, "tid": 7, "ts": 1, "dur": 9}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    t = load_trace(p)
    assert C.step_mask(t).tolist() == [True, False]


# ---- categories ------------------------------------------------------------------------------

def test_category_masks_on_a_recorded_gpu_trace():
    t = load_trace(GPU)
    cat = t.strings("cat")
    assert set(cat[C.kernel_mask(t)]) == {"kernel"} and C.kernel_mask(t).sum() == 5
    assert set(cat[C.gpu_work_mask(t)]) == {"kernel", "gpu_memcpy", "gpu_memset"}
    host = set(cat[C.host_mask(t)])
    assert host == {"cpu_op", "cuda_runtime", "user_annotation"}  # not the "Trace" frame span
    assert set(t.strings("name", C.host_op_mask(t))) == {"aten::mm", "aten::add", "aten::copy_", "c10d::allreduce_"}


def test_the_category_sets_partition_what_kineto_writes():
    assert C.GPU_CATS == C.KERNEL_CATS | C.MEMCPY_CATS | C.MEMSET_CATS | C.GPU_ANNOTATION_CATS | C.GPU_SYNC_CATS
    groups = [C.KERNEL_CATS, C.MEMCPY_CATS, C.MEMSET_CATS, C.GPU_ANNOTATION_CATS, C.GPU_SYNC_CATS, C.RUNTIME_CATS,
              C.HOST_OP_CATS, C.USER_ANNOTATION_CATS, C.PYTHON_CATS, C.FRAME_CATS, C.FLOW_CATS, C.OTHER_KINETO_CATS]
    assert sum(len(g) for g in groups) == len(frozenset().union(*groups))  # disjoint
    assert C.KNOWN_CATS == frozenset().union(*groups)
    assert C.MTIA_CATS <= C.KERNEL_CATS | C.RUNTIME_CATS
    assert all(c == c.lower() for g in groups for c in g)  # compared lower-case


@pytest.mark.parametrize("name, frame", [
    ("nn.Module: Linear_0", True), ("<built-in method matmul of type object at 0x7f>", True),
    ("torch/nn/modules/linear.py(125): forward", True), ("aten::linear", False), ("forward", False),
])
def test_python_frame_names(name, frame):
    assert C.is_python_frame_name(name) is frame


# ---- communication ---------------------------------------------------------------------------

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize("name", [
    NCCL_KERNEL, "ncclKernel_AllGather_RING_LL_Sum_int8_t", "ncclDevKernel_Generic",
    "gloo:all_reduce", "gloo:broadcast", "nccl:all_reduce", "nccl:all_gather", "nccl:_reduce_scatter_base",
    "c10d::allreduce_", "c10d::broadcast_", "c10d::barrier", "record_param_comms", "ProcessGroupNCCL::allreduce",
    "_c10d_functional::all_reduce", "_c10d_functional::all_to_all_single",
    "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>",
])
def test_collectives(name):
    assert C.is_comm(name)


@pytest.mark.parametrize("name", [
    "aten::broadcast_tensors", "aten::broadcast_to", "aten::all_reduce", "aten::_allgather_base_like",
    "aten::addmm", "aten::copy_", "cudaMemcpyAsync", "Memcpy DtoD (Device -> Device)",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_EpilogueWithBroadcast_64x64>",
    "void cub::DeviceReduceKernel<BlockBarrier>", "ampere_sgemm_128x64_nn", "ProfilerStep#1", "",
    # ATen's elementwise launcher, 49 / 98 kernels of the xDiT FLUX / SD3.5 traces (issue #42)
    "void at::native::type_specialized_broadcast_kernel_launcher<at::native::BinaryFunctor<float>>",
    "type_specialized_broadcast_kernel_launcher", "block_barrier_sync",
])
def test_not_collectives(name):
    assert not C.is_comm(name)


def test_comm_mask_on_the_recorded_traces():
    t = load_trace(GPU)
    assert set(t.strings("name", C.comm_mask(t))) == {NCCL_KERNEL, "c10d::allreduce_"}
    names = set()
    for path in sorted(PAIR.glob("*.json")):
        pt = load_trace(path)
        names |= set(pt.strings("name", C.comm_mask(pt)))
        assert "aten::broadcast_tensors" in set(pt.strings("name")) or path.name != "rank0.pt.trace.json"
    assert names == {"gloo:all_reduce", "gloo:broadcast", "c10d::allreduce_", "record_param_comms"}


def test_comm_mask_leaves_copies_and_gpu_annotations_out(tmp_path):
    evs = [{"ph": "X", "cat": c, "name": "nccl:all_reduce", "pid": 0, "tid": 7, "ts": i, "dur": 1}
           for i, c in enumerate(("gpu_user_annotation", "gpu_memcpy", "kernel", "cpu_op"))]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    assert C.comm_mask(load_trace(p)).tolist() == [False, False, True, True]


# Kernel names as the libraries' kernels appear in Kineto traces. The expert-parallel ones are read in
# deepseek-ai/profile-data's train.json (DeepSeek-V3 training on H800, EP64: not kept here, it has no
# licence); the RCCL one in TraceLens' MI300 trace (tests/data/traces/public/tracelens).
FAMILIES = [
    (NCCL_KERNEL, "NCCL"), ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "NCCL"),
    ("nccl:all_reduce", "NCCL"),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*)",
     "expert-parallel all-to-all"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*)", "expert-parallel all-to-all"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)", "expert-parallel all-to-all"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)", "expert-parallel all-to-all"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "expert-parallel all-to-all"),
    ("void deep_ep::internode_ll::combine<false, 7168>(void*, void const*)", "expert-parallel all-to-all"),
    ("void pplx::(anonymous namespace)::dispatchKernel<32, 7168>(int*)", "expert-parallel all-to-all"),
    ("void allreduce8<__half>(__half*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long)", "MSCCL++"),
    ("mscclKernel_Sum_float_Simple_false", "MSCCL"),
    ("nvshmemi_proxy_progress_kernel", "NVSHMEM"), ("nvshmem_barrier_all_on_stream_kernel", "NVSHMEM"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, int)",
     "custom all-reduce"),
    ("void sglang::cross_device_reduce_2stage<half, 4>(sglang::RankData*)", "custom all-reduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(AllReduceParams)",
     "custom all-reduce"),
    ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16>(x)",
     "custom all-reduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>", "torch symmetric memory"),
    ("gloo:all_reduce", "gloo"), ("c10d::allreduce_", "c10d"), ("record_param_comms", "c10d"),
    ("_c10d_functional::all_to_all_single", "collective"),
]
LOCAL_NAMED_LIKE_COMM = [
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*)",   # EP layout: local work
    "moe_align_block_size_kernel", "fused_moe_kernel", "triton_poi_fused_combine_0",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>",
]


@pytest.mark.parametrize("name, family", FAMILIES)
def test_communication_families(name, family):
    assert C.comm_family(name) == family
    assert C.is_comm(name)   # COMM_RE is every family at once


@pytest.mark.parametrize("name", LOCAL_NAMED_LIKE_COMM + ["aten::all_reduce", "EpilogueWithBroadcast"])
def test_local_kernels_named_like_communication_are_not(name):
    assert C.comm_family(name) is None and not C.is_comm(name)


def test_nccl_named_kernels_are_rccl_on_a_rocm_trace():
    rocm = load_trace(DATA / "traces" / "public" / "tracelens" / "mi300_resnet_rccl_no_pyfn.json.gz")
    cuda = load_trace(DATA / "traces" / "public" / "hta" / "nccl_allreduce_rank0.json.gz")
    assert C.is_rocm(rocm) and not C.is_rocm(cuda)
    (gpu,) = [f for f in C.communication(rocm).families if f.where == "GPU"]
    assert gpu.family == "RCCL" and gpu.example.startswith("ncclDevKernel_Generic") and gpu.events == 17
    (gpu,) = [f for f in C.communication(cuda).families if f.where == "GPU"]
    assert gpu.family == "NCCL" and gpu.events == 21


def _two_stream_trace(tmp_path, comm_name: str, meta: dict | None = None):
    """One step: three 500 µs GEMMs on stream 7 and, each starting 300 µs into one, three 400 µs kernels
    named ``comm_name`` on stream 28 (half of each runs beside the GEMM, half alone)."""
    evs = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 3200}]
    for i in range(3):
        t = 100 + 1000 * i
        for c, (name, stream, dur, at) in enumerate(((f"sm90_xmma_gemm_{i}", 7, 500, t), (comm_name, 28, 400, t + 300))):
            corr = 10 * i + c + 1
            evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t - 20 + c,
                     "dur": 5, "args": {"correlation": corr}},
                    {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": at, "dur": dur,
                     "args": {"device": 0, "stream": stream, "correlation": corr}}]
    p = tmp_path / "two_streams.json"
    p.write_text(json.dumps({"traceEvents": evs, **(meta or {})}))
    return load_trace(p)


def _one_stream_trace(tmp_path, names: list, meta: dict | None = None):
    """One step, one stream: ``names`` one after another, 100 µs each, 50 µs apart."""
    evs = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
            "dur": 150 * len(names) + 100}]
    for i, name in enumerate(names):
        evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10 + 150 * i,
                 "dur": 5, "args": {"correlation": i + 1}},
                {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 50 + 150 * i, "dur": 100,
                 "args": {"device": 0, "stream": 7, "correlation": i + 1}}]
    p = tmp_path / "one_stream.json"
    p.write_text(json.dumps({"traceEvents": evs, **(meta or {})}))
    return load_trace(p)


WORLD_1 = {"distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"}}
WORLD_8 = {"distributedInfo": {"rank": 0, "world_size": 8, "backend": "nccl"}}


def test_a_kernel_named_like_a_collective_needs_a_world_and_a_communication_stream(tmp_path):
    """Issue #42: a kernel named only by an operation ("broadcast", "all_gather") is communication where the
    trace can communicate (world size not 1) and it runs on a communication stream; a library's kernel (NCCL)
    counts by its name."""
    from diagnostics.trace import temporal_breakdown
    from diagnostics.trace.gpu_activity import comm_overlap

    generic = "void at::native::broadcast_kernel<float>(float*)"   # a word start: COMM_RE matches the name
    assert C.is_comm(generic) and C.comm_family(generic) == C.GENERIC_FAMILY
    # world size 1, on their own stream: nothing to communicate with
    t = _two_stream_trace(tmp_path, generic, WORLD_1)
    assert not C.comm_mask(t).any() and C.communication(t).families == ()
    (note,) = [n for n in C.communication(t).notes if "named like a collective" in n]
    assert note.startswith("3 kernels (1.200 ms) are named like a collective") and "world size is 1" in note
    assert to_plain(comm_overlap(t))["overlap_pct"] is None          # "not counted", not 0.0 %
    assert sum(r.communication_us for r in temporal_breakdown(t).gpu) == 0.0
    # the same kernels where the world size is unknown or 8: their stream is all theirs -> communication
    for meta in (None, WORLD_8):
        t = _two_stream_trace(tmp_path, generic, meta)
        assert C.comm_mask(t).sum() == 3 and to_plain(comm_overlap(t))["overlap_pct"] == pytest.approx(50.0)
    # world size 8, but launched among the GEMMs on the compute stream: compute
    t = _one_stream_trace(tmp_path, ["sm90_xmma_gemm_0", generic, "sm90_xmma_gemm_1", "sm90_xmma_gemm_2"], WORLD_8)
    assert not C.comm_mask(t).any()
    assert any("they run on compute streams" in n for n in C.communication(t).notes)
    # a library's kernel counts by its name, world size 1 or not, on any stream
    t = _one_stream_trace(tmp_path, ["sm90_xmma_gemm_0", NCCL_KERNEL, "sm90_xmma_gemm_1"], WORLD_1)
    assert t.strings("name", C.comm_mask(t)).tolist() == [NCCL_KERNEL]
    # the user's pattern still wins
    t = _two_stream_trace(tmp_path, generic, WORLD_1)
    C.use_comm_kernels(t, r"broadcast_kernel")
    assert C.comm_mask(t).sum() == 3


def test_expert_parallel_all_to_all_is_communication_in_every_view(tmp_path):
    """The reported case: an expert-parallel training trace read "communication 0 us" and "overlap: not
    counted" while one stream was mostly dispatch / combine."""
    from diagnostics.trace import temporal_breakdown
    from diagnostics.trace.comm import rank_breakdown
    from diagnostics.trace.gpu_activity import comm_overlap

    t = _two_stream_trace(tmp_path, "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16>(int4*)")
    # GPU time is counted once, compute first: the 200 µs of each combine that runs alone is communication.
    assert sum(r.communication_us for r in temporal_breakdown(t).gpu) == pytest.approx(600.0)
    o = to_plain(comm_overlap(t))
    assert o["comm_us"] == pytest.approx(1200.0) and o["overlap_pct"] == pytest.approx(50.0)
    assert o["families"] == ["expert-parallel all-to-all"]
    steps = rank_breakdown(t)
    assert steps["steps"][0]["comm_ms"] == pytest.approx(1.2)
    assert {c["family"] for c in steps["calls"] if c["where"] == "GPU"} == {"expert-parallel all-to-all"}


def test_in_house_kernels_get_a_note_and_the_users_pattern_counts_them(tmp_path):
    from diagnostics.trace import temporal_breakdown
    from diagnostics.trace.gpu_activity import comm_overlap

    t = _two_stream_trace(tmp_path, "acme_ring_send_recv_kernel<bf16>", {
        "distributedInfo": {"rank": 3, "world_size": 8, "backend": "nccl"}})
    c = C.communication(t)
    assert c.families == () and [(s.stream, s.share) for s in c.suspect_streams] == [(28, 1.0)]
    assert any("GPU 0 stream 28: 100% of its kernel time (1.200 ms) is in kernels whose names suggest communication"
               in n and "--comm-kernels" in n for n in c.notes)
    assert any("rank 3 of a distributed job (world size 8" in n and "communication reads 0 because nothing matched"
               in n for n in c.notes)
    o = to_plain(comm_overlap(t))
    assert o["overlap_pct"] is None and any("suggest communication" in n for n in o["notes"])   # said, not a silent 0
    C.use_comm_kernels(t, r"^acme_ring_")
    c = C.communication(t)
    assert [(f.family, f.events) for f in c.families] == [(C.USER_FAMILY, 3)] and c.notes == ()
    assert sum(r.communication_us for r in temporal_breakdown(t).gpu) == pytest.approx(600.0)
    assert to_plain(comm_overlap(t))["overlap_pct"] == pytest.approx(50.0)
    C.use_comm_kernels(t, "nothing_like_it")
    assert any("matches no GPU kernel" in n for n in C.communication(t).notes)
    with pytest.raises(ValueError, match=r"comm_kernels: '\(' is not a regular expression"):
        C.use_comm_kernels(t, "(")


def test_the_comm_kernels_option_is_declared_once_and_checked():
    from diagnostics.declare import COMM_KERNELS, OptionError
    from diagnostics.registry import ANALYSES

    have = sorted(name for name, a in ANALYSES.items() if "comm_kernels" in a.option_keys)
    assert have == ["distributed", "distributed_traces", "trace"]
    for name in have:
        assert ANALYSES[name].option("comm_kernels") is COMM_KERNELS
    with pytest.raises(OptionError, match=r"option comm_kernels: '\[' is not a regular expression"):
        ANALYSES["trace"].validate({"path": "x.json", "comm_kernels": "["})


@pytest.mark.parametrize("name, family", [
    ("aten::addmm", "matmul"), ("aten::copy_", "memory"), ("aten::view", "view"),
    ("c10d::allreduce_", "communication"), ("gloo:all_reduce", "communication"),
    ("aten::broadcast_tensors", "elementwise"),  # a shape op, not a collective
    ("aten::native_layer_norm", "normalization"), ("AddmmBackward0", "autograd"),
    ("Optimizer.step#SGD.step", "optimizer"), ("aten::relu", "elementwise"),
    ("aten::sum", "reduction"), ("my_function", "other"),
])
def test_op_family(name, family):
    assert C.op_family(name) == family


# ---- Tensor Cores ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "sm80_xmma_gemm_f16f16_f16f32", "volta_h884gemm_64x64", "ampere_fp16_s16816gemm", "cutlass_gemm_tensorop_f16",
    "sm90_wgmma_x", "turing_i8816gemm_int8", "cutlass_80_tensorop_s1688gemm_64x64", "sm90_xmma_gemm_f32f32_tf32f32",
    "ampere_bf16_s16816gemm_bf16_128x64", "flash_fwd_kernel", "fmha_cutlassF_f16_aligned",
])
def test_tensor_core_kernels(name):
    assert C.uses_tensor_cores(name)


# FP32 / FP64 SIMT kernels on Tensor-Core GPUs: the architecture prefix alone says nothing.
@pytest.mark.parametrize("name", [
    "elementwise_kernel", "ampere_sgemm_128x64_nn", "ampere_dgemm_64x64", "sm80_sgemm_nn",
    "cutlass_80_simt_sgemm_128x128", "volta_sgemm_128x64_tn", "void at::native::reduce_kernel",
    "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8", "", None,
])
def test_cuda_core_kernels(name):
    assert not C.uses_tensor_cores(name)


#: Kernel names read on an H100 (torch 2.11+cu130, cuBLAS / cuDNN of CUDA 13) for Linear, Conv2d,
#: scaled_dot_product_attention and LSTM, forward and backward, in fp32, tf32, fp16 and bf16.
H100_TENSOR_CORE_KERNELS = (
    "nvjet_sm90_hsh_128x64_64x8_1x2_h_bz_NNT",  # fp16 Linear
    "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_bias_TNT",  # bf16 Linear
    "nvjet_sm90_tst_64x80_64x11_2x1_v_bz_TNT",  # bf16 LSTM
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_warpsize2x2x1_g1_"
    "tensor16x8x8_execute_kernel__5x_cudnn",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_"
    "execute_segment_k_off_kernel__5x_cudnn",
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_256x64_16x4_nhwc_unity_stride_align4>",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>",
)
H100_CUDA_CORE_KERNELS = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
    "kernel__5x_cublas",  # fp32 Linear with TF32 off
    "sm80_xmma_gemm_cf32cf32_f32f32_cf32_nt_n_tilesize32x32x8_stage3_warpsize2x2x1_ffma_aligna8_alignc8_execute_"
    "kernel__5x_cublas",  # the complex fp32 GEMM of cuDNN's FFT convolution
    "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x32x8_stage3_warpsize2x2x1_g1_ffma_"
    "aligna4_alignc4_execute_kernel__5x_cudnn",
    "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::"
    "wgrad_indexed::Warp_specialized_params>",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>",
    "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>",
    "nvjet_sm90_sss_128x64_64x8_1x2_h_bz_NNT",  # an all-fp32 nvjet GEMM (named by the same scheme)
)


@pytest.mark.parametrize("name", H100_TENSOR_CORE_KERNELS)
def test_hopper_tensor_core_kernels_are_recognised(name):
    assert C.uses_tensor_cores(name)


@pytest.mark.parametrize("name", H100_CUDA_CORE_KERNELS)
def test_hopper_cuda_core_kernels_are_not_counted_as_tensor_core(name):
    assert not C.uses_tensor_cores(name)


# ---- one definition each ---------------------------------------------------------------------

ENGINE = ROOT / "diagnostics"
#: Words of a communication rule (what a second "is this a collective" test would spell out).
COMM_WORDS = re.compile(r"nccl|rccl|msccl|nvshmem|deep_?ep|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
                        r"|record_param|cross_device", re.I)
#: Names only classify.py may define.
CLASSIFIERS = {"is_comm", "uses_tensor_cores", "op_family", "step_number", "step_label", "is_python_frame_name",
               "comm_mask", "step_mask", "kernel_mask", "host_mask", "gpu_work_mask", "host_op_mask",
               "comm_family", "comm_families", "communication", "user_comm_mask", "is_rocm", "collective_op"}
RULE_NAME = re.compile(r"^_?\w*(STEP|COMM|TENSOR_CORE|TC)\w*_(RE|PATTERNS?)$")
KINETO_CATS = {c for g in (C.GPU_CATS, C.RUNTIME_CATS, C.HOST_OP_CATS, C.USER_ANNOTATION_CATS, C.PYTHON_CATS)
               for c in g}


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


#: Modules that write step ranges rather than read them, where the trace layer cannot be imported; each
#: spells the name once (checked against classify's step pattern below).
OWN_STEP_RANGES = {"attach/agent.py": "runs inside the user's process (torch and the standard library only)"}


def test_the_attach_agents_step_ranges_are_what_the_step_pattern_reads():
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent", ENGINE / "attach" / "agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    assert C.STEP_RE.search(f"{agent.STEP_RANGE}12")


def second_definitions(engine: Path = ENGINE) -> list[str]:
    """Places in the engine outside trace/classify.py that spell out a classifier of their own: a
    step pattern, a communication test by name, a category set, or one of classify's names; and an
    interval union outside trace/intervals.py."""
    found = []
    for path in sorted(engine.rglob("*.py")):
        rel = path.relative_to(engine).as_posix()
        if rel == "trace/classify.py" or rel in OWN_STEP_RANGES:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        where = lambda node, what: found.append(f"{rel}:{node.lineno}: {what}")  # noqa: E731
        for node in ast.walk(tree):
            s = _str(node)
            if s is not None and id(node) not in docs and "ProfilerStep" in s:
                where(node, f"step pattern {s!r}")
            if isinstance(node, ast.Call):
                fn = node.func
                attr = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                arg = _str(node.args[0]) if node.args else None
                if attr in ("compile", "search", "match", "fullmatch", "startswith", "endswith", "find") \
                        and arg and COMM_WORDS.search(arg):
                    where(node, f"communication test {attr}({arg!r})")
            if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
                left = _str(node.left)
                if left and COMM_WORDS.search(left):
                    where(node, f"communication test {left!r} in ...")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                if node.name in CLASSIFIERS:
                    where(node, f"def {node.name}")
                if "union" in node.name.lower() and rel != "trace/intervals.py":
                    where(node, f"interval union {node.name}")
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    name = target.id if isinstance(target, ast.Name) else ""
                    if RULE_NAME.match(name):
                        where(node, f"rule {name}")
            if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
                items = {_str(e) for e in node.elts} - {None}
                if len(items & KINETO_CATS) >= 2 and items <= KINETO_CATS:
                    where(node, f"category set {sorted(items)}")
    return found


def test_each_classifier_is_defined_once():
    found = second_definitions()
    assert not found, "defined again outside trace/classify.py (import it from there):\n" + "\n".join(found)


def test_the_guard_finds_a_second_definition(tmp_path):
    pkg = tmp_path / "diagnostics"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        '"""ProfilerStep#N in a docstring is fine."""\n'
        'import re\n'
        'MY_STEP_RE = re.compile(r"^ProfilerStep#(\\d+)$")\n'
        'COMM = re.compile(r"^(gloo:|nccl)")\n'
        'def f(name):\n'
        '    return "nccl" in name.lower() or name.startswith("c10d::")\n'
        'def is_comm(name):\n'
        '    return False\n'
        'def _intervals_union(spans):\n'
        '    return 0.0\n'
        'CATS = frozenset({"kernel", "gpu_memcpy"})\n')
    kinds = " | ".join(second_definitions(pkg))
    for what in ("step pattern", "rule MY_STEP_RE", "communication test compile", "communication test 'nccl' in",
                 "communication test startswith", "def is_comm", "interval union _intervals_union",
                 "category set"):
        assert what in kinds, what
    assert "docstring" not in kinds

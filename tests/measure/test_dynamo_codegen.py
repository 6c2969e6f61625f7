"""measure.dynamo.empty_cache_codegen: inductor's CPU codegen without the vector-ISA probe and the precompiled
header (one-off costs of the job's empty compiler cache), the ISA from the CPU's flags only when the compiler
accepts them, and inductor's settings restored after."""

import pytest
import torch

from diagnostics.measure import dynamo


def test_the_probe_and_the_header_are_skipped_inside_and_restored_after():
    import torch._inductor.config as config
    from torch._inductor import cpu_vec_isa

    before = (config.cpp.vec_isa_ok, config.cpp_cache_precompile_headers)
    with dynamo.empty_cache_codegen():
        assert config.cpp_cache_precompile_headers is False
        if cpu_vec_isa.valid_vec_isa_list():  # a CPU with vector units: the best of them, from its flags
            assert config.cpp.vec_isa_ok is True
            isa = cpu_vec_isa.pick_vec_isa()
            assert all(f in cpu_vec_isa.x86_isa_checker() for f in str(isa).split()) or not isa
    assert (config.cpp.vec_isa_ok, config.cpp_cache_precompile_headers) == before


def test_a_compiler_that_refuses_the_isas_flags_leaves_inductor_to_probe(monkeypatch):
    import torch._inductor.config as config

    monkeypatch.setattr(dynamo, "_compiler_accepts", lambda flags: False)
    with dynamo.empty_cache_codegen():
        assert config.cpp.vec_isa_ok is None and config.cpp_cache_precompile_headers is False


def test_the_compiler_check_accepts_no_flags_and_refuses_nonsense():
    assert dynamo._compiler_accepts("")
    assert not dynamo._compiler_accepts("-mno-such-flag-at-all")


@pytest.mark.slow
def test_inductor_compiles_the_same_kernels_inside():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 16)
    with dynamo.empty_cache_codegen(), torch.no_grad():
        out = torch.compile(model)(x)
    torch._dynamo.reset()
    torch.testing.assert_close(out, model(x))

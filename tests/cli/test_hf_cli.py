"""The CLI's --hf: a transformers config by architecture and sizes or by config.json, built with random
weights in the (sandboxed) worker; the meta path for a 7B config; bad flags and keys named by message."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import cli

transformers = pytest.importorskip("transformers")

GPT2 = "gpt2:n_layer=2,n_embd=64,n_head=4,vocab_size=1000"


def storage_numel(model) -> int:
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[(p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape))] = p.numel()
    return sum(seen.values())


def test_summary_of_an_architecture_with_sizes_in_the_sandbox(tmp_path, monkeypatch):
    from diagnostics.sandbox import probe

    if probe().ok:
        monkeypatch.setenv("TORCHSCOPE_SANDBOX", "1")  # a job fails rather than run unconfined
    p = cli("summary", "--hf", GPT2, "--seq-len", "32", "--json", "--no-report", data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000))
    assert result["metrics"]["params_total"] == storage_numel(ref) == 229_632
    assert result["inputs"] == [{"shape": [2, 32], "dtype": "int64"}]
    assert result["model"] == "gpt2 (hf)" and "causal-LM" in result["loss"]
    assert result["metrics"]["flops_forward_per_token"] == result["metrics"]["flops_forward"] / 64


def test_config_json_with_hf_set_and_batch_size(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2,
                               "n_embd": 64, "n_head": 4, "vocab_size": 1000, "transformers_version": "4.40.0"}))
    p = cli("summary", "--hf", cfg, "--hf-set", "n_layer=1", "--batch-size", "3", "--seq-len", "8", "--json",
            "--no-report", data_dir=tmp_path / "d")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=1000))
    assert result["metrics"]["params_total"] == storage_numel(ref)
    assert result["inputs"] == [{"shape": [3, 8], "dtype": "int64"}]


def test_7b_llama_memory_is_counted_on_the_meta_device(tmp_path):
    p = cli("memory", "--hf", "llama:hidden_size=4096,num_hidden_layers=32,num_attention_heads=32,"
            "intermediate_size=11008,vocab_size=32000", "--hf-meta", "--no-report", data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    params = 6_738_415_616
    lines = {ln.strip().split("  ")[0]: ln for ln in p.stdout.splitlines()}
    assert "Training-step peak" in p.stdout and "n/a" in lines["Training-step peak"]  # not measured, not 0
    assert "not measured" in p.stdout and "100 GiB" in lines["Weights + gradients + optimizer state"]
    p = cli("memory", "--hf", "llama:hidden_size=4096,num_hidden_layers=32,num_attention_heads=32,"
            "intermediate_size=11008,vocab_size=32000", "--hf-meta", "--json", "--no-report", data_dir=tmp_path)
    m = json.loads(p.stdout)["metrics"]
    assert (m["param_bytes"], m["grad_bytes"], m["optimizer_state_bytes"]) == (params * 4, params * 4, params * 8)


def test_bad_keys_and_flags_are_named(tmp_path):
    p = cli("summary", "--hf", "gpt2:n_layers=2", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "unknown gpt2 config key 'n_layers' (did you mean n_layer" in p.stderr
    p = cli("summary", "--hf", "gpt2", "--model", "mlp", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "--model and --hf are two model sources" in p.stderr
    p = cli("summary", "--model", "mlp", "--seq-len", "16", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "--seq-len need --hf" in p.stderr
    p = cli("summary", "--hf", "gpt2", "--input", "2,16:int64", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "--input do not apply to --hf" in p.stderr
    p = cli("summary", "--hf", str(tmp_path / "missing.json"), "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "config file not found" in p.stderr
    p = cli("summary", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "--model (a sample name" in p.stderr and "or --hf" in p.stderr
    p = cli("profile", "--hf", GPT2, "--hf-meta", "--no-report", data_dir=tmp_path)
    assert p.returncode == 2 and "only the counting analyses run on it" in p.stderr


def test_summary_of_a_t5_config_with_a_decoder_length(tmp_path):
    p = cli("summary", "--hf", "t5:d_model=64,d_ff=128,num_layers=2,num_decoder_layers=2,num_heads=4,d_kv=16,"
            "vocab_size=500", "--seq-len", "24", "--decoder-len", "10", "--batch-size", "3", "--json", "--no-report",
            data_dir=tmp_path)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    ref = transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16, vocab_size=500))
    assert result["metrics"]["params_total"] == storage_numel(ref)
    assert result["inputs"] == [{"shape": [3, 24], "dtype": "int64", "name": "input_ids"},
                                {"shape": [3, 10], "dtype": "int64", "name": "decoder_input_ids"}]
    assert result["model"] == "t5 (hf)" and "seq2seq-LM" in result["loss"]


def test_decoder_len_flags_are_checked(tmp_path):
    p = cli("summary", "--model", "mlp", "--decoder-len", "8", data_dir=tmp_path)
    assert p.returncode == 2 and "--decoder-len need --hf" in p.stderr
    p = cli("summary", "--hf", "t5:d_model=32,num_heads=2,d_kv=16", "--decoder-len", "1", data_dir=tmp_path)
    assert p.returncode == 2 and "bad --decoder-len 1: must be at least 2" in p.stderr
    p = cli("summary", "--hf", GPT2, "--decoder-len", "8", data_dir=tmp_path)
    assert p.returncode != 0 and "a decoder length applies to the seq2seq-lm task" in p.stderr

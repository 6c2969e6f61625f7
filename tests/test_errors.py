"""explain(exc): the cause kept, tensor dumps and log prefixes dropped, a remedy for known causes."""

import torch
from torch import nn

from diagnostics.errors import MAX_EXPLAIN_CHARS, clean_message, explain


def test_a_tensor_dump_is_dropped_and_the_reason_after_it_kept():
    """torch.jit.trace names the output it cannot type by its repr: the logits' values, then the reason."""
    logits = torch.randn(2, 8, 50)
    e = RuntimeError(f"Tracer cannot infer type of Out(logits={logits!r}, cache=Cache(layers=[L, L]))\n:Only "
                     "tensors and (possibly nested) tuples of tensors, lists, or dicts are supported as inputs or "
                     "outputs of traced functions, but instead got value of type Cache.")
    text = explain(e)
    assert text.startswith("RuntimeError: Tracer cannot infer type of Out(logits=tensor(...), cache=Cache(layers=[L, L])) "
                           ":Only tensors and (possibly nested) tuples of tensors")
    assert "but instead got value of type Cache." in text  # the reason, which a 300-character cut lost
    assert "this model's output holds a Cache" in text and "`return model(ids, use_cache=False).logits`" in text
    assert "tensor([" not in text and f"{logits[0, 0, 0].item():.4f}" not in text


def test_number_runs_log_prefixes_and_tracebacks_reduce_to_the_cause():
    runs = RuntimeError("index out of range in " + str(list(range(200))) + " at position 7")
    assert clean_message(str(runs)) == "index out of range in ... at position 7"
    logged = ("W1124 07:33:26.354000 13526 torch/export/__init__.py:348] Ran into an error\n"
              "W1124 07:33:26.354000 13526 torch/export/__init__.py:348] Traceback (most recent call last):\n"
              'W1124 07:33:26.354000 13526 torch/export/__init__.py:348]   File "x.py", line 3, in load\n'
              "W1124 07:33:26.354000 13526 torch/export/__init__.py:348]     raise NotImplementedError(\n"
              "W1124 07:33:26.354000 13526 torch/export/__init__.py:348] NotImplementedError: Deserializing "
              "pkg.Out in pytree is not registered.")
    assert clean_message(logged) == "Ran into an error NotImplementedError: Deserializing pkg.Out in pytree is not registered."
    assert "(here pkg.Out)" in explain(RuntimeError(logged))


def test_a_long_message_keeps_its_head_and_its_tail():
    e = ValueError("the start " + "word " * 500 + "the cause at the end")
    text = explain(e)
    assert len(text) <= len("ValueError: ") + MAX_EXPLAIN_CHARS + 5
    assert text.startswith("ValueError: the start word") and text.endswith("the cause at the end")
    assert " ... " in text


def test_remedies_for_known_causes_and_none_for_others():
    class D(nn.Module):
        def forward(self, x):
            return {"logits": x * 2}

    try:
        torch.jit.trace(D(), (torch.randn(2, 3),))
    except RuntimeError as e:
        text = explain(e)
    assert text.startswith("RuntimeError: Encountering a dict at the output of the tracer")
    assert "what to do: torch.jit.trace (strict) refuses a dict output" in text and "strict=False" in text
    try:
        nn.Linear(3, 3)(torch.randn(2, 3, dtype=torch.bfloat16))
    except RuntimeError as e:
        assert "what to do: parameters and activations are in different dtypes" in explain(e)
    assert explain(KeyError("plain")) == "KeyError: 'plain'"
    assert explain(RuntimeError()) == "RuntimeError: (no message)"

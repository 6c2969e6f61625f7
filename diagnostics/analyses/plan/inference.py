"""Inference on fake tensors: a forward pass without autograd, or for a Hugging Face decoder a prompt
into a KV cache and one generated token, as ``generate`` runs them.

For a causal-LM built from a transformers config, the prompt (batch x seq tokens) runs through the
inner model with a ``DynamicCache`` (the logits of its last position only, ``logits_to_keep=1``, as
``generate`` asks), then one token more with the cache. The cache's tensors are counted as the
category "kv cache" as they are stored. With a KV dtype other than the model's (``kv_dtype``),
transformers still keeps K/V in the compute dtype, so the cache is traced in that dtype and its bytes
rescaled to the KV dtype's element size afterwards (planner.kv_rescale), which the notes say.
"""

from __future__ import annotations

import inspect

from diagnostics.analyses.plan.ledger import Ledger


def hf_decoder(model):
    """The transformers model inside a plan's copy when it is a causal LM with a cache, else None."""
    inner = getattr(model, "model", None)
    if getattr(model, "task", None) != "causal-lm" or inner is None:
        return None
    cfg = getattr(inner, "config", None)
    if cfg is None or getattr(cfg, "is_encoder_decoder", False):
        return None
    return inner


def _cache(hf, ledger: Ledger):
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    update = cache.update

    def counted(*args, **kwargs):
        keys, values = update(*args, **kwargs)
        ledger.mark(keys, "kv cache")
        ledger.mark(values, "kv cache")
        return keys, values

    cache.update = counted
    return cache


def run_inference(loaded, model, inputs, config, ledger: Ledger) -> list[str]:
    """Run the configuration's inference (inside the ledger, fake mode and no_grad); returns notes."""
    hf = hf_decoder(model)
    if hf is None:
        inputs.call(model)
        return ["inference: one forward pass in eval mode without autograd (no KV cache: not a decoder "
                "built from a transformers config)"]
    ids = inputs.args[0] if inputs.args else next(iter(inputs.kwargs.values()))
    cache = _cache(hf, ledger)
    params = inspect.signature(hf.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers renamed it in 5.x
    hf(input_ids=ids, use_cache=True, **{cache_kw: cache}, **keep)
    hf(input_ids=ids[:, -1:], use_cache=True, **{cache_kw: cache}, **keep)
    notes = [f"inference: a prompt of {ids.shape[1]} tokens into a KV cache (transformers' DynamicCache), then one "
             f"generated token; logits of the last position only" + ("" if keep else " (this model computes every "
                                                                       "position's logits)")]
    return notes

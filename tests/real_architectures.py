"""Real architectures nobody here wrote, built from small transformers configs (nothing downloaded), shared
by the tests that check invariants on them: HF specs (``hf_spec``) for those the --hf intake builds, and
Python-file models (``python_spec``) for those it has no task head for (speech, detection).

Sources: the model classes are transformers' own (Apache-2.0); only the configs' sizes are chosen here."""

from __future__ import annotations

import textwrap

from diagnostics.hf import HFSettings
from diagnostics.spec import ModelSpec

#: SpeechT5 speech-to-text (a convolutional feature encoder, a transformer encoder with relative
#: positions, a text decoder): its feature encoder asks for its first convolution's input gradient only in
#: training mode.
SPEECHT5 = """
    import torch
    import transformers


    def build_model():
        torch.manual_seed(0)
        cfg = transformers.SpeechT5Config(
            hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100, conv_dim=(16, 16), conv_stride=(5, 2),
            conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            max_speech_positions=600, max_text_positions=64)
        return transformers.SpeechT5ForSpeechToText(cfg)


    def example_inputs():
        g = torch.Generator().manual_seed(0)
        return {"input_values": torch.randn(2, 1600, generator=g),
                "decoder_input_ids": torch.randint(0, 100, (2, 8), generator=g)}


    def loss_fn(output):
        # the next token of a fixed target sequence
        logits = output.logits
        labels = torch.arange(logits.shape[1]).remainder(logits.shape[-1]).expand(logits.shape[0], -1)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
"""

PYTHON_MODELS = {"speecht5": SPEECHT5}


def python_spec(arch: str, folder) -> ModelSpec:
    path = folder / f"{arch}.py"
    path.write_text(textwrap.dedent(PYTHON_MODELS[arch]))
    return ModelSpec(source="python", name=path.name, path=str(path))


def hf_spec(config: dict, seq_len: int = 32) -> ModelSpec:
    return ModelSpec(source="hf", name=config["model_type"], hf=HFSettings(config, None, seq_len, strict=False).to_json())

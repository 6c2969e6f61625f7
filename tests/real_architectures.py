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

#: DETR (a ResNet backbone, transformers' own: no timm, nothing pretrained): its first decoder layer's
#: queries are all zero, so that layer's self-attention output projection gets a gradient ~1000x the
#: encoder's. The loss: each query's class and box against a fixed target (Hungarian matching needs scipy).
DETR = """
    import torch
    import transformers


    def build_model():
        torch.manual_seed(0)
        backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                             out_features=["stage2"])
        cfg = transformers.DetrConfig(
            use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, d_model=32,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10, num_labels=5)
        return transformers.DetrForObjectDetection(cfg)


    def example_inputs():
        return {"pixel_values": torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))}


    def loss_fn(output):
        logits, boxes = output.logits, output.pred_boxes  # (B, queries, classes + 1), (B, queries, 4)
        g = torch.Generator().manual_seed(1)
        labels = torch.randint(0, logits.shape[-1], logits.shape[:2], generator=g)
        target = torch.rand(boxes.shape, generator=g)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return ce + 5 * torch.nn.functional.l1_loss(boxes, target)
"""

#: Whisper (a convolutional stem over log-mel features, an encoder-decoder transformer).
WHISPER = """
    import torch
    import transformers


    def build_model():
        torch.manual_seed(0)
        cfg = transformers.WhisperConfig(
            vocab_size=100, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1)
        return transformers.WhisperForConditionalGeneration(cfg)


    def example_inputs():
        g = torch.Generator().manual_seed(0)
        return {"input_features": torch.randn(2, 8, 32, generator=g),
                "decoder_input_ids": torch.randint(3, 100, (2, 8), generator=g)}


    def loss_fn(output):
        logits = output.logits
        labels = torch.arange(logits.shape[1]).remainder(logits.shape[-1]).expand(logits.shape[0], -1)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
"""

PYTHON_MODELS = {"speecht5": SPEECHT5, "detr": DETR, "whisper": WHISPER}

#: Built by the --hf intake (its task heads and losses), each a few layers wide and deep.
HF_CONFIGS = {
    # encoders
    "bert": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 500, "max_position_embeddings": 64},
    "modernbert": {"model_type": "modernbert", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                   "intermediate_size": 96, "vocab_size": 500, "max_position_embeddings": 64,
                   "global_attn_every_n_layers": 3, "local_attention": 16, "pad_token_id": 0},
    "deberta": {"model_type": "deberta", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "vocab_size": 500, "relative_attention": True,
                "pos_att_type": ["p2c", "c2p"], "max_relative_positions": 64},
    # decoders
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 200, "n_positions": 64},
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 500},
    # encoder-decoders
    "t5": {"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
           "d_kv": 8, "vocab_size": 200, "tie_word_embeddings": False},
    "bart": {"model_type": "bart", "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
             "decoder_ffn_dim": 64, "vocab_size": 200, "max_position_embeddings": 64},
    # vision
    "vit": {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "image_size": 32, "patch_size": 8, "num_labels": 10},
    "segformer": {"model_type": "segformer", "num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1],
                  "hidden_sizes": [16, 32], "num_attention_heads": [1, 2], "patch_sizes": [7, 3], "strides": [4, 2],
                  "mlp_ratios": [2, 2], "image_size": 32, "num_labels": 10, "decoder_hidden_size": 32},
    "swin": {"model_type": "swin", "image_size": 32, "patch_size": 2, "embed_dim": 16, "depths": [2, 2],
             "num_heads": [2, 4], "window_size": 4, "num_labels": 10},
    # mixture of experts
    "mixtral": {"model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 200, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    # state space
    "mamba": {"model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 200,
              "state_size": 8, "expand": 2, "conv_kernel": 4},
}


def spec_of(arch: str, folder) -> ModelSpec:
    """The spec of a corpus architecture: a Python-file model (written into ``folder``) or an --hf config."""
    return python_spec(arch, folder) if arch in PYTHON_MODELS else hf_spec(HF_CONFIGS[arch])



def python_spec(arch: str, folder) -> ModelSpec:
    path = folder / f"{arch}.py"
    path.write_text(textwrap.dedent(PYTHON_MODELS[arch]))
    return ModelSpec(source="python", name=path.name, path=str(path))


def hf_spec(config: dict, seq_len: int = 32) -> ModelSpec:
    return ModelSpec(source="hf", name=config["model_type"], hf=HFSettings(config, None, seq_len, strict=False).to_json())

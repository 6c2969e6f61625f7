"""A held-out speech encoder-decoder (transformers' SpeechEncoderDecoderModel: a wav2vec2 encoder on raw
audio, a BERT decoder with cross-attention; small random config, nothing downloaded). Its two inputs have
lengths of their own: 4000 audio samples and 8 decoder tokens. LayerDrop and SpecAugment masking are off:
both draw random numbers that decide the control flow, which fake tensors cannot follow."""

import torch
import transformers


def build_model():
    torch.manual_seed(0)
    enc = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                      conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, layerdrop=0.0, mask_time_prob=0.0)
    dec = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=100, is_decoder=True, add_cross_attention=True)
    cfg = transformers.SpeechEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id = 0, 0
    return transformers.SpeechEncoderDecoderModel(cfg)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_values": torch.randn(2, 4000, generator=g),
            "decoder_input_ids": torch.randint(0, 100, (2, 8), generator=g)}

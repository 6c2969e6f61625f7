"""The shared sidebar: model picker (samples or uploads), inputs editor, device choice and facts.

It ends by storing the current, validated ModelSpec in session state for every page to read.
An upload replaces the current model only after a worker loaded it and ran one forward pass (in the
background: ui.jobs); otherwise its error is shown and the previous model stays.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from diagnostics.analyses.validate import ValidateResult
from diagnostics.devices import device_report
from diagnostics.errors import SpecError, TorchScopeError
from diagnostics.runner import spares
from diagnostics.sandbox import will_confine
from diagnostics.settings import safe_mode
from diagnostics.spec import DEFAULT_INT_HIGH, DTYPES, InputSpec, ModelSpec, parse_shape
from diagnostics.spec import parse_inputs as spec_parse_inputs
from diagnostics.units import human_bytes
from diagnostics.uploads import AUTO, AUTO_LABEL, KIND_LABELS, MODEL_KINDS, detect_kind, save_upload
from sample_models import DEFAULT_SAMPLE, SAMPLES
from ui import state
from ui.jobs import cached_outcome, get_store, run_analysis
from ui.notices import show_notices

INT_DTYPES = ("int64", "int32")



@st.cache_data(ttl=5, show_spinner=False)
def _device_report() -> dict:
    """GPUs (one NVML session for the device list and the panel) and the CPU. torch's thread count
    comes from a spare worker (the server does not import torch for it, nor for anything else of a
    first page); with spares off, from torch imported here, as the CLI does."""
    rep = device_report(import_torch=False)
    if rep["cpu"]["torch_threads"] is None:
        if spares().size:
            rep["cpu"]["torch_threads"] = spares().torch_threads()  # None until the first spare is ready
        else:
            rep = device_report()
    return rep


def _devices() -> list[str]:
    return ["cpu"] + [f"cuda:{g['index']}" for g in _device_report()["gpus"] if g.get("index") is not None]


def parse_inputs(text: str, default_dtype: str, high: int) -> tuple[InputSpec, ...] | None:
    """'8,3,32,32 ; 8,16:int64' -> InputSpecs, in the engine's one input grammar (diagnostics.spec);
    integer inputs draw values from [0, high). Empty text: None (the model's own example inputs)."""
    try:
        return spec_parse_inputs(text, default_dtype, high)
    except SpecError as e:
        raise SpecError(f"input {e}") from None


def _allowed_kinds() -> list[str]:
    # Safe mode runs graph code (TorchScript, .pt2) only in a sandboxed worker: none here, none offered.
    refused = ("python", "pickle") + (() if will_confine() else ("torchscript", "export"))
    return [k for k in MODEL_KINDS if not (safe_mode() and k in refused)]


def _upload_form() -> None:
    """Upload a model (and weights); validate it in a worker; switch to it only if it loads."""
    kinds = _allowed_kinds()
    if not kinds:
        st.caption("Server-safe mode without a job sandbox: model uploads are disabled (see the notice above).")
        return
    chosen = st.selectbox("File kind", [AUTO] + kinds, key="sb_upload_kind",
                          format_func=lambda k: AUTO_LABEL if k == AUTO else KIND_LABELS[k],
                          help="what the model file is; detected from its contents by default")
    if safe_mode():
        st.caption("Server-safe mode: Python files and pickled modules are disabled.")
    model_file = st.file_uploader("Model file", key="sb_upload_model")
    kind, kind_error = chosen, None
    if chosen == AUTO and model_file is not None:
        try:
            kind = detect_kind(model_file.getvalue(), model_file.name)
            if kind not in kinds:
                kind_error = f"{model_file.name} is a {KIND_LABELS[kind]}, which this server does not load"
            else:
                st.caption(f"Detected: {KIND_LABELS[kind]}")
        except TorchScopeError as e:
            kind_error = str(e)
    weights_file = st.file_uploader("Weights (optional): .safetensors or a state_dict .pt", key="sb_upload_weights",
                                    type=["safetensors", "pt", "pth", "bin"])
    trust = False
    if kind == "pickle":
        trust = st.checkbox("I trust this file (unpickling can run any code on this server)", value=False,
                            key="sb_trust")
    shapes = st.text_input("Input shapes (needed for TorchScript)", key="sb_upload_shapes",
                           placeholder="e.g. 8,3,32,32 ; 8,16:int64 ; input_ids=8,16:int64",
                           help="Batch first. Separate several inputs with ';'; ':dtype' after a shape gives that "
                                "input its own dtype; NAME= before a shape makes it a keyword input "
                                "(forward(NAME=tensor)), after the positional ones. Leave empty to use the model's "
                                "own example inputs (.pt2, Python file).")
    c1, c2 = st.columns(2)
    dtype = c1.selectbox("Input dtype", DTYPES, key="sb_upload_dtype", help="for inputs without ':dtype'")
    high = c2.number_input("Integer values below", min_value=1, max_value=2**31 - 1, value=DEFAULT_INT_HIGH,
                           key="sb_upload_high", help="integer inputs (token or class ids) are drawn from "
                                                      "[0, this): the vocabulary or number of classes")
    if st.button("Load model", type="primary", disabled=model_file is None, key="sb_load"):
        try:
            if kind_error:
                raise TorchScopeError(kind_error)
            store = get_store()
            path, digest = save_upload(model_file.getvalue(), kind, store.data_dir, model_file.name)
            weights_path = None
            if weights_file is not None:
                wpath, wdigest = save_upload(weights_file.getvalue(), "weights", store.data_dir, weights_file.name)
                weights_path, digest = str(wpath), digest + wdigest[:16]
            inputs = parse_inputs(shapes, dtype, int(high))
            spec = ModelSpec(source=kind, name=model_file.name[:80], path=str(path), weights_path=weights_path,
                             file_sha256=digest, trust_pickle=trust, inputs=inputs)
        except TorchScopeError as e:
            st.session_state[state.LOAD_ERROR] = str(e)
            return
        st.session_state[state.PENDING_LOAD] = {"spec": spec.to_dict(), "name": model_file.name}
        run_analysis("validate", spec, force=True, label=f"Loading {model_file.name}")  # draws its panel
        return
    _follow_load()


#: The size fields of the Hugging Face form: (label, config key) — transformers maps these common
#: names onto each architecture's own (GPT-2's n_layer, n_embd, n_head).
HF_SIZES = (("Layers", "num_hidden_layers"), ("Hidden size", "hidden_size"), ("Attention heads", "num_attention_heads"),
            ("Vocabulary", "vocab_size"))
#: Encoder-decoder architectures have an encoder and a decoder stack: their own keys (the common
#: num_hidden_layers would set the encoder's only, leaving the decoder at its default depth).
HF_SIZES_BY_ARCH = {
    "t5": (("Encoder layers", "num_layers"), ("Decoder layers", "num_decoder_layers"), ("Model width", "d_model"),
           ("Feed-forward width", "d_ff"), ("Attention heads", "num_heads"), ("Head width", "d_kv"),
           ("Vocabulary", "vocab_size")),
    "bart": (("Encoder layers", "encoder_layers"), ("Decoder layers", "decoder_layers"), ("Model width", "d_model"),
             ("Encoder heads", "encoder_attention_heads"), ("Decoder heads", "decoder_attention_heads"),
             ("Encoder FFN width", "encoder_ffn_dim"), ("Decoder FFN width", "decoder_ffn_dim"),
             ("Vocabulary", "vocab_size")),
}


@st.cache_data(show_spinner=False)
def _hf_defaults(model_type: str) -> dict:
    """The architecture's default sizes (transformers' config class defaults)."""
    from diagnostics.hf import make_config

    cfg, _ = make_config({"model_type": model_type})
    keys = [k for _, k in HF_SIZES_BY_ARCH.get(model_type, HF_SIZES)] + ["intermediate_size"]
    return {k: int(getattr(cfg, k)) for k in keys if isinstance(getattr(cfg, k, None), int)}


@st.cache_data(show_spinner=False)
def _is_encoder_decoder(model_type: str) -> bool:
    """Whether the architecture's config is an encoder-decoder one (T5, BART): it takes a decoder length."""
    from diagnostics.hf import make_config

    try:
        cfg, _ = make_config({"model_type": model_type})
    except (TorchScopeError, ImportError):
        return False
    return bool(getattr(cfg, "is_encoder_decoder", False))


def _hf_form() -> None:
    """A transformers config (an architecture with sizes, or a config.json) built with random
    weights in a worker, checked like an upload before it replaces the current model."""
    from diagnostics.hf import ARCHITECTURES, DEFAULT_SEQ_LEN, TASKS, HFSettings, parse_assignments, read_config_json

    how = st.radio("Config", ["Architecture", "config.json"], horizontal=True, key="sb_hf_how")
    try:
        if how == "Architecture":
            arch = st.selectbox("Architecture", ARCHITECTURES, key="sb_hf_arch")
            defaults = _hf_defaults(arch)
            config, strict = {"model_type": arch}, True
            cols = st.columns(2)
            for n, (label, key) in enumerate(HF_SIZES_BY_ARCH.get(arch, HF_SIZES)):
                if key in defaults:
                    config[key] = int(cols[n % 2].number_input(label, min_value=1, value=defaults[key], step=1,
                                                               key=f"sb_hf_{arch}_{key}"))
            extra = st.text_input("More config keys", key="sb_hf_extra", placeholder="e.g. intermediate_size=512",
                                  help="KEY=VALUE pairs separated by commas; any key of the architecture's config")
            config.update(parse_assignments(extra, "more config keys"))
        else:
            upload = st.file_uploader("config.json", type=["json"], key="sb_hf_file")
            config, strict = (read_config_json(upload.getvalue(), upload.name), False) if upload else (None, False)
    except (TorchScopeError, ImportError) as e:
        st.error(str(e))
        return
    c1, c2 = st.columns(2)
    task = c1.selectbox("Task", ("auto",) + TASKS, key="sb_hf_task",
                        help="the head and loss; auto: from the config's architectures, else seq2seq-LM for "
                             "encoder-decoders (t5, bart), masked-LM for encoders and causal-LM for decoders")
    seq_len = int(c2.number_input("Sequence length", min_value=1, max_value=1 << 20, value=DEFAULT_SEQ_LEN,
                                  key="sb_hf_seq"))
    decoder_len = None
    encoder_decoder = bool(config) and (bool(config.get("is_encoder_decoder"))
                                        or _is_encoder_decoder(str(config["model_type"])))
    if task == "seq2seq-lm" or (task == "auto" and encoder_decoder):
        dec = c2.number_input("Decoder length", min_value=2, max_value=1 << 20, value=None, key="sb_hf_dec",
                              placeholder="= sequence length",
                              help="decoder tokens per sequence (decoder_input_ids); empty: the sequence length")
        decoder_len = None if dec is None else int(dec)
    st.caption("Random weights, nothing downloaded. A config too big for this machine is built on the meta "
               "device: parameters, FLOPs and weight / gradient / optimizer memory are counted, nothing measured.")
    if st.button("Build model", type="primary", disabled=config is None, key="sb_hf_build"):
        try:
            settings = HFSettings(config, None if task == "auto" else task, seq_len, "auto", strict, decoder_len)
            spec = ModelSpec(source="hf", name=str(config["model_type"])[:80], hf=settings.to_json())
        except TorchScopeError as e:
            st.session_state[state.LOAD_ERROR] = str(e)
            return
        st.session_state[state.PENDING_LOAD] = {"spec": spec.to_dict(), "name": spec.name}
        run_analysis("validate", spec, force=True, label=f"Building {spec.name}")
        return
    _follow_load()


def _follow_load() -> None:
    """The upload being checked in a worker (in the background: its panel shows meanwhile): once it
    ends, switch to the model, or keep the previous one and say why."""
    pending = st.session_state.get(state.PENDING_LOAD)
    if not pending:
        return
    spec, name = ModelSpec.from_dict(pending["spec"]), pending["name"]
    outcome = cached_outcome("validate", spec)
    if outcome is not None and outcome.status == "running":
        return
    del st.session_state[state.PENDING_LOAD]
    if outcome is None:  # cancelled
        st.session_state[state.LOAD_ERROR] = f"{name}: loading was cancelled; press Load model to try again"
    elif outcome.ok:
        st.session_state[state.MODEL_INFO] = {"spec": spec.to_dict(), "check": outcome.result}
        st.session_state[state.LOAD_ERROR] = None
    else:  # the loader's errors name the file already; others (the model rejected its inputs) do not
        error = outcome.error or outcome.status
        st.session_state[state.LOAD_ERROR] = error if error.startswith(name) else f"{name}: {error}"


def _inputs_editor(base: ModelSpec, declared: tuple[InputSpec, ...]) -> ModelSpec | None:
    """Batch size, and per input its shape, dtype and integer range. Left as declared, the spec keeps
    the model's own example inputs (an uploaded file's real values, e.g. sorted sequence lengths)."""
    ident = f"{base.source}-{base.name}-{base.file_sha256 or ''}"
    batched = bool(declared) and len(declared[0].shape) > 0
    if batched:
        batch = int(st.number_input("Batch size", min_value=1, max_value=65536, value=int(declared[0].shape[0]),
                                    step=1, key=f"sb_batch_{ident}"))
    elif not declared:
        st.caption("The model takes no inputs.")
        return base
    else:
        st.caption("The first input is a scalar, so there is no batch size to change.")
    edited = []
    with st.expander("Input shapes and dtypes"):
        for i, inp in enumerate(declared):
            c1, c2 = st.columns([3, 2])
            lead = inp.shape[:1] if batched and inp.shape else ()
            label = f"Keyword input {inp.name}" if inp.name else f"Input {i + 1}"
            text = c1.text_input(f"{label} shape" + (" (after batch)" if lead else ""),
                                 ",".join(map(str, inp.shape[len(lead):])), key=f"sb_shape_{ident}_{i}")
            dt = c2.selectbox("dtype", DTYPES, index=DTYPES.index(inp.dtype), key=f"sb_dtype_{ident}_{i}")
            high = None
            if dt in INT_DTYPES:
                high = int(st.number_input(f"{label}: integer values below", min_value=1,
                                           max_value=2**31 - 1, value=int(inp.high or DEFAULT_INT_HIGH),
                                           key=f"sb_high_{ident}_{i}",
                                           help="values are drawn from [0, this): the vocabulary or class count"))
            try:
                rest = parse_shape(text) if text.strip() else ()
                first = (batch,) if lead else ()
                edited.append(InputSpec(first + rest, dt, high, inp.name))
            except TorchScopeError as e:
                st.error(f"{label}: {e}")
                return None
    if tuple(edited) == tuple(declared):
        return replace(base, batch_size=None)  # unchanged: the declared inputs, with their own values
    return replace(base, inputs=tuple(edited), batch_size=None)


def render_sidebar() -> ModelSpec:
    sb = st.sidebar
    show_notices()
    with sb:
        st.header("Model")
        source = st.radio("Source", ["Built-in sample", "Upload a file", "Hugging Face config"], horizontal=True,
                          key="sb_source")
        base, declared = None, None
        if source == "Built-in sample":
            names = list(SAMPLES)
            name = st.selectbox("Sample model", names, index=names.index(DEFAULT_SAMPLE), key="sb_sample",
                                format_func=lambda n: n + (" ⚠ sick" if SAMPLES[n].sick else ""))
            st.caption(SAMPLES[name].description)
            base, declared = ModelSpec(source="sample", name=name), SAMPLES[name].inputs
        else:
            _upload_form() if source == "Upload a file" else _hf_form()
            failed = st.session_state.get(state.LOAD_ERROR)
            if failed:
                st.error(failed)
            info = st.session_state.get(state.MODEL_INFO)
            if info:
                base = ModelSpec.from_dict(info["spec"])
                check: ValidateResult = info["check"]  # the load check's typed result
                declared = tuple(i.to_spec() for i in check.inputs)  # keyword ones named
                loaded = f"{base.name} ({check.model_type})"
                if failed:  # never a green "Loaded" beside a failed load: the pages still use the earlier one
                    st.info(f"Not loaded; the pages keep using {loaded}, loaded before.")
                else:
                    st.success(f"Loaded {loaded}")
                for note in check.notes:
                    st.warning(note)
            else:
                st.info("No uploaded model yet: the pages keep showing the previous model.")

        st.header("Inputs & device")
        spec = state.current_spec()
        if base is not None:
            edited = _inputs_editor(base, declared)
            if edited is not None:
                spec = edited
        devices = _devices()
        device = st.selectbox("Device", devices, key="sb_device",
                              help="Each CUDA GPU when present, else the CPU")
        spec = replace(spec, device=device)
        state.set_spec(spec)
        with st.expander("Device facts"):
            _device_panel()
        st.caption(f"Runs are stored in `{get_store().data_dir}`")
    return spec


def _device_panel() -> None:
    rep = _device_report()
    for g in rep["gpus"]:
        st.markdown(f"**GPU {g['index']}: {g['name']}** · driver {g['driver']}")
        st.progress(min(1.0, g["memory_used_bytes"] / max(1, g["memory_total_bytes"])),
                    text=f"memory {human_bytes(g['memory_used_bytes'])} / {human_bytes(g['memory_total_bytes'])}")
        st.caption(f"utilization {g['utilization_pct']} % · {g['temperature_c']} °C · "
                   f"{g['power_w'] or 0:.0f} W of {g['power_limit_w'] or 0:.0f} W")
    if rep["message"]:
        st.caption(rep["message"])
    c = rep["cpu"]
    st.markdown(f"**CPU:** {c['model']}")
    st.caption(f"{c['logical_cores']} logical cores ({c['affinity_cores']} usable) · RAM "
               f"{human_bytes(c['ram_available_bytes'])} free of {human_bytes(c['ram_total_bytes'])} · "
               + (f"torch threads {c['torch_threads']}" if c["torch_threads"] is not None
                  else "torch threads: not read yet (a worker is starting)"))

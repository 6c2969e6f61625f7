"""Weights files read without running their code: a .safetensors file or a state_dict saved by torch.save,
checked before anything is read into memory (``check_weights_file``), loaded with ``weights_only=True``
(``load_state_dict_file``) and applied strictly, naming the first mismatches (``apply_weights``).
Every failure raises a ModelLoadError (or a TrustError for pickled code) whose message names the file.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import torch
from torch import nn

from diagnostics.errors import ModelLoadError, TrustError

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def refused_global(e: Exception) -> str:
    """The line of a weights-only unpickling error that names what it refused, without colour codes."""
    text = ANSI.sub("", str(e))
    line = next((ln.strip() for ln in text.splitlines() if "Unsupported global" in ln), "")
    return line.split(" was not an allowed global")[0]


#: safetensors dtypes and their bytes per element (the format's own list).
_SAFETENSORS_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
#: A safetensors header larger than this is not one (the format's own limit is 100 MB).
_SAFETENSORS_MAX_HEADER = 100_000_000


def _invalid_weights(name: str, why: str, path: Path) -> ModelLoadError:
    kind = ".safetensors file" if path.suffix == ".safetensors" else "weights file"
    return ModelLoadError(f"{name} is not a valid {kind}: {why}")


def check_weights_file(path: Path, name: str) -> None:
    """Refuse at once, before anything is read into memory, a weights file that cannot be one: empty,
    sparse (mostly never written: it reads as zeros, and a 2 GiB one only ran out of memory), a
    .safetensors whose header does not describe its bytes, anything else that is neither a zip
    archive nor a pickle stream (torch.save's two formats)."""
    st = path.stat()
    if st.st_size == 0:
        raise _invalid_weights(name, "it is empty (0 bytes)", path)
    if st.st_size > (1 << 20) and st.st_blocks * 512 < st.st_size // 2:
        raise _invalid_weights(name, f"it is sparse: {st.st_size / 2**20:,.1f} MiB long, but only "
                                     f"{st.st_blocks * 512 / 2**20:,.1f} MiB of it was ever written (the rest are "
                                     "holes that read as zeros)", path)
    with open(path, "rb") as f:
        head = f.read(8)
        if path.suffix != ".safetensors":
            if not zipfile.is_zipfile(f) and head[:1] != b"\x80":
                raise _invalid_weights(name, f"it is neither a torch.save archive nor a safetensors file (it starts "
                                             f"with the bytes {head.hex(' ')})", path)
            return
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= min(st.st_size - 8, _SAFETENSORS_MAX_HEADER):
            raise _invalid_weights(name, f"its safetensors header length ({n:,} bytes) does not fit in a file of "
                                         f"{st.st_size:,} bytes", path)
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            raise _invalid_weights(name, f"its safetensors header is not JSON ({e})", path) from None
    if not isinstance(header, dict):
        raise _invalid_weights(name, "its safetensors header is not a JSON object", path)
    data, end = st.st_size - 8 - n, 0
    for key, t in header.items():
        if key == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        shape = t.get("shape") if isinstance(t, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data and isinstance(shape, list)
                and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise _invalid_weights(name, f"tensor {key!r} has no valid shape and data offsets within the file's "
                                         f"{data:,} data bytes", path)
        size = _SAFETENSORS_BYTES.get(t.get("dtype"))
        count = 1
        for d in shape:
            count *= d
        if size is not None and offsets[1] - offsets[0] != count * size:
            raise _invalid_weights(name, f"tensor {key!r} ({t.get('dtype')} {shape}) should take {count * size:,} "
                                         f"bytes, its offsets give {offsets[1] - offsets[0]:,}", path)
        end = max(end, offsets[1])
    if end != data:
        raise _invalid_weights(name, f"its tensors take {end:,} bytes but {data:,} follow the header", path)


def load_state_dict_file(path: Path, name: str | None = None) -> dict[str, torch.Tensor]:
    """Read weights safely: .safetensors, or a state_dict .pt with weights_only=True. Errors call the
    file ``name`` (default: its file name); a file that cannot hold weights is named invalid before
    anything is loaded (``check_weights_file``)."""
    name = name or path.name
    if not path.exists():
        raise ModelLoadError(f"weights file not found: {name}")
    check_weights_file(path, name)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        try:
            return load_file(str(path))
        except Exception as e:
            raise ModelLoadError(f"{name} is not a valid .safetensors file: {e}") from e
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = ANSI.sub("", str(e)).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise TrustError(f"{name} is not a plain state_dict: loading it would run pickled code "
                             f"({refused_global(e) or msg}). Save weights with torch.save(model.state_dict()) "
                             "or safetensors") from e
        raise ModelLoadError(f"{name} could not be read as a state_dict (corrupt or truncated?): {msg}") from e
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelLoadError(f"{name} does not hold a state_dict (a dict of name -> tensor)")
    return obj


def apply_weights(model: nn.Module, state: dict[str, torch.Tensor], name: str = "weights") -> None:
    """load_state_dict(strict) with an error that names the first mismatches."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {list(state[k].shape)} vs model {list(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:3])}"
                        f"{' ...' if len(unexpected) > 3 else ''}")
    if shapes:
        problems.append(f"shape mismatches ({len(shapes)}): {'; '.join(shapes[:3])}{' ...' if len(shapes) > 3 else ''}")
    if problems:
        raise ModelLoadError(f"{name} do not match the model: " + " | ".join(problems))
    model.load_state_dict(state, strict=True)

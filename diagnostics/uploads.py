"""Storing uploaded files: size limit, content hash, and names we choose (never the user's)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from diagnostics.errors import ModelLoadError
from diagnostics.settings import env_number

MAX_UPLOAD_ENV = "TORCHSCOPE_MAX_UPLOAD_MB"
DEFAULT_MAX_UPLOAD_MB = 1024

#: kind -> (file name we store it under, extensions a user may give)
MODEL_KINDS = {
    "torchscript": ("model.ts.pt", (".pt", ".pth", ".ts", ".zip", ".jit")),
    "export": ("model.pt2", (".pt2",)),
    "python": ("model.py", (".py",)),
    "pickle": ("model.pickle.pt", (".pt", ".pth", ".pkl", ".pickle")),
}
WEIGHT_EXTS = (".safetensors", ".pt", ".pth", ".bin")
#: The names an uploaded weights file is stored under (.safetensors, anything else).
WEIGHTS_NAMES = ("weights.safetensors", "weights.pt")


def archive_kind(names: list[str]) -> str:
    """What a zip archive written by torch is, from its member names: "export" (torch.export .pt2),
    "torchscript" (torch.jit.save), "torch.save" (a pickled object or state_dict) or "unknown".
    The one place that tells them apart (the CLI's --model sniffing and the loader's check)."""
    if any(n.endswith("/archive_format") for n in names) or any("/models/" in n and n.endswith(".json")
                                                                 for n in names):
        return "export"
    if any("/code/" in n for n in names) or any(n.endswith("constants.pkl") for n in names):
        return "torchscript"
    if any(n.endswith("/data.pkl") for n in names):
        return "torch.save"
    return "unknown"


def sniff_kind(path: Path) -> str:
    """archive_kind of the file at ``path``, or "not a zip" (e.g. the legacy torch.save format)."""
    try:
        with zipfile.ZipFile(path) as z:
            return archive_kind(z.namelist())
    except (zipfile.BadZipFile, OSError):
        return "not a zip"


def max_upload_bytes() -> int:
    return int(env_number(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_MB) * 2**20)


def check_size(n_bytes: int, what: str = "upload") -> None:
    limit = max_upload_bytes()
    if n_bytes > limit:
        raise ModelLoadError(f"the {what} is {n_bytes / 2**20:.1f} MiB, over the upload limit of "
                             f"{limit / 2**20:.0f} MiB (set {MAX_UPLOAD_ENV} to change it)")
    if n_bytes == 0:
        raise ModelLoadError(f"the {what} is empty (0 bytes)")


def save_upload(data: bytes, kind: str, data_dir: Path, original_name: str = "") -> tuple[Path, str]:
    """Write ``data`` under data_dir/uploads/<sha256>/ with a fixed name for ``kind``.

    ``kind`` is a model kind from MODEL_KINDS or "weights". The user's file name is used only to
    check and keep its extension among the allowed ones; it never becomes part of a path.
    """
    check_size(len(data), f"file {original_name!r}" if original_name else "upload")
    ext = Path(original_name).suffix.lower() if original_name else ""
    if kind == "weights":
        if ext and ext not in WEIGHT_EXTS:
            raise ModelLoadError(f"weights must be .safetensors or a state_dict .pt/.pth, not {ext!r}")
        name = WEIGHTS_NAMES[0] if ext == ".safetensors" else WEIGHTS_NAMES[1]
    elif kind == "trace":
        if ext and ext not in (".json", ".gz"):
            raise ModelLoadError(f"a trace should be a .json or .json.gz file, not {ext!r}")
        name = "trace.json.gz" if data[:2] == b"\x1f\x8b" else "trace.json"
    elif kind in MODEL_KINDS:
        name, exts = MODEL_KINDS[kind]
        if ext and ext not in exts:
            raise ModelLoadError(f"a {kind} model file should end in {' / '.join(exts)}, not {ext!r}")
    else:
        raise ModelLoadError(f"unknown upload kind {kind!r}")
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(data_dir) / "uploads" / digest[:32]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.exists():
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path, digest

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
#: How each kind is named where a user picks it (the sidebar) and in errors that ask for another.
KIND_LABELS = {
    "torchscript": "TorchScript archive (torch.jit.save)",
    "export": "torch.export archive (.pt2)",
    "python": "Python file with build_model() and example_inputs()",
    "pickle": "Pickled nn.Module (torch.save(model)) — runs code",
}
#: The upload kind that reads the kind from the file itself (``detect_kind``).
AUTO = "auto"
AUTO_LABEL = "Detect from the file"
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


#: What a file is, as said in errors, by the kind detect_kind finds.
_WHAT = {"torchscript": "a TorchScript archive (torch.jit.save)", "export": "a torch.export archive (.pt2)",
         "python": "a Python file", "pickle": "a torch.save file (a pickled object)"}


def _head_and_names(source: bytes | Path) -> tuple[bytes, list[str] | None]:
    """The first bytes of ``source`` (the file's contents, or a path) and its zip member names (None:
    not a zip archive)."""
    import io

    if isinstance(source, (bytes, bytearray)):
        head, opener = bytes(source[:4096]), (lambda: zipfile.ZipFile(io.BytesIO(source)))
    else:
        with open(source, "rb") as f:
            head = f.read(4096)
        opener = lambda: zipfile.ZipFile(source)  # noqa: E731
    if head[:4] != b"PK\x03\x04":
        return head, None
    try:
        with opener() as z:
            return head, z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError):
        return head, None


def _is_safetensors(head: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then a JSON header."""
    return len(head) > 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 100_000_000


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:  # a multi-byte character cut at the end of the head is still text
        return e.start > len(head) - 4
    return b"\x00" not in head


def detect_kind(source: bytes | Path, name: str) -> str:
    """The model kind (a MODEL_KINDS key) of an uploaded file, from its contents, its extension breaking
    ties: a zip archive by its members (``archive_kind``: torch.export, TorchScript, or torch.save, which
    loads as a pickle), a pickle stream (the legacy torch.save format), a text file as Python. A file of
    no model kind (weights, a config.json, anything else) is a ModelLoadError saying where it goes."""
    head, names = _head_and_names(source)
    ext = Path(name).suffix.lower()
    if names is not None:
        kind = archive_kind(names)
        if kind == "unknown":
            raise ModelLoadError(f"{name} is a zip archive but not one torch writes (no TorchScript code, "
                                 "torch.export program or pickled data in it): cannot tell what model it holds")
        return "pickle" if kind == "torch.save" else kind
    if head[:1] == b"\x80":  # pickle protocol 2+: the legacy (non-zip) torch.save format
        return "pickle"
    if _is_safetensors(head):
        raise ModelLoadError(f"{name} is a safetensors weights file, not a model: it goes in the weights slot, "
                             "beside a model definition (a Python file, TorchScript or .pt2)")
    if _is_text(head):
        text = head.decode("utf-8", "ignore").lstrip()
        if ext == ".json" or text.startswith("{"):
            raise ModelLoadError(f"{name} is a JSON file, not a model: a transformers config.json is built under "
                                 "Source → Hugging Face config")
        if ext == ".py" or any(w in text for w in ("import ", "def ", "class ")):
            return "python"
    raise ModelLoadError(f"cannot tell what kind of model {name} is: not a zip archive from torch (TorchScript, "
                         ".pt2, torch.save), a pickle, or a Python file; choose its kind")


def check_kind(source: bytes | Path, name: str, kind: str, remedy=None) -> None:
    """A ModelLoadError naming what the file is when ``kind`` (chosen by the user) is not what it holds,
    and what to do: ``remedy(found_kind)`` (default: the file kind to choose in the sidebar). A file of
    no kind we know is left to the loader, whose error says what it is not."""
    try:
        found = detect_kind(source, name)
    except ModelLoadError:
        if kind == "python" and Path(name).suffix.lower() not in ("", ".py"):
            raise ModelLoadError(f"{name} does not look like a Python file (no import, def or class in its first "
                                 "lines, and its name does not end in .py)") from None
        return
    if found != kind:
        todo = remedy(found) if remedy else f"choose the file kind '{KIND_LABELS[found]}' (or '{AUTO_LABEL}')"
        raise ModelLoadError(f"{name} is {_WHAT[found]}, not {_WHAT[kind]}: {todo}")


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

    ``kind`` is a model kind from MODEL_KINDS (``detect_kind`` finds it from the contents), "weights" or
    "trace". The user's file name is used only to check its extension (weights, traces) and to name the
    file in errors; it never becomes part of a path. A model kind the contents contradict is refused,
    naming what the file is.
    """
    check_size(len(data), f"file {original_name!r}" if original_name else "upload")
    if kind in MODEL_KINDS:
        check_kind(data, original_name or "the upload", kind)
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
        name = MODEL_KINDS[kind][0]  # the contents were checked above: an extension is only a convention
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

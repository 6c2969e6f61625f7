"""Do no harm, on real training scripts nobody here wrote (tests/data/pytorch_examples, BSD-3, see its
SOURCE.md): each runs bare and attached with the same seed, and must end with the same exit code, print
the same stdout apart from its own timings (its losses to the last digit), save checkpoints equal tensor
for tensor, and be counted one step per training batch. Each runs two real Pythons: slow."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.attach.harness import ROOT, Ran, env_for

pytestmark = pytest.mark.slow
EXAMPLES = ROOT / "tests" / "data" / "pytorch_examples"
#: The scripts' own timings, the only part of their stdout that may differ between two runs.
TIMINGS = re.compile(r"(ms/batch|time:)\s*[0-9.]+s?")


def _run(tmp: Path, argv: list, attached: bool, options=(), env=None) -> Ran:
    cmd = [sys.executable, *argv]
    if attached:
        cmd = [sys.executable, "-m", "diagnostics", "run", "--json", "--no-report", *options, "--", *cmd]
    p = subprocess.run(cmd, cwd=tmp, env=env_for(tmp, env), capture_output=True, text=True, timeout=600, input="")
    return Ran(p, tmp / "no-timing.json")


def _both(tmp_path: Path, argv: list, options=(), env=None):
    (tmp_path / "bare").mkdir()
    (tmp_path / "attached").mkdir()
    return _run(tmp_path / "bare", argv, False, env=env), _run(tmp_path / "attached", argv, True, options, env=env)


def _same_output(bare: Ran, ran: Ran) -> None:
    assert ran.code == bare.code, (bare.stderr[-2000:], ran.stderr[-2000:])
    assert TIMINGS.sub(r"\1 T", ran.script_stdout) == TIMINGS.sub(r"\1 T", bare.stdout.strip())
    assert ran.script_stderr.strip() == bare.stderr.strip()


def _corpus(folder: Path, words: int = 60) -> Path:
    """A small text corpus in wikitext's layout (train / valid / test), the same every time."""
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(words)]
    folder.mkdir(parents=True)
    for name, lines in (("train", 120), ("valid", 30), ("test", 30)):
        text = "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 20))) for _ in range(lines))
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


def _train_batches(data: Path, batch_size: int, bptt: int) -> int:
    """main.py's training batches per epoch: its batchify and range(0, len - 1, bptt), computed here."""
    tokens = sum(len(line.split()) + 1 for line in (data / "train.txt").read_text().splitlines())
    rows = tokens // batch_size
    return math.ceil((rows - 1) / bptt)


def _script_intervals(stdout: str) -> list[tuple[int, int, float]]:
    """main.py's own timing lines: (epoch, batch, ms per batch over the log interval that ends there)."""
    return [(int(e), int(b), float(ms)) for e, b, ms in
            re.findall(r"epoch\s+(\d+) \|\s+(\d+)/\s*\d+ batches .*?ms/batch\s*([0-9.]+)", stdout)]


def _same_checkpoint(a: Path, b: Path) -> None:
    """torch.save's archive read as data, never unpickled (a pickle is code): the same records, each storage
    (a tensor's bytes) and the pickled structure equal byte for byte."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names = za.namelist()
        assert [n.split("/", 1)[1] for n in names] == [n.split("/", 1)[1] for n in zb.namelist()]
        storages = [n for n in names if "/data/" in n and not n.endswith(".pkl")]
        assert storages  # the model's tensors are there
        for na, nb in zip(names, zb.namelist()):
            if not na.endswith(("/version", "/byteorder", "/.format_version", "/.storage_alignment")):
                assert za.read(na) == zb.read(nb), na


@pytest.mark.parametrize("model,extra,boundary", [
    ("LSTM", [], "manual update"),
    ("Transformer", ["--use-optimizer", "--lr", "0.001"], "optimizer"),
])
def test_word_language_model_ends_saves_and_learns_as_bare(tmp_path, model, extra, boundary):
    data = _corpus(tmp_path / "corpus")
    epochs, bsz, bptt = 2, 4, 8
    argv = [str(EXAMPLES / "word_language_model" / "main.py"), "--data", str(data), "--model", model,
            "--emsize", "32", "--nhid", "32", "--nlayers", "1", "--epochs", str(epochs), "--batch_size", str(bsz),
            "--bptt", str(bptt), "--log-interval", "10", "--save", "model.pt", *extra]
    bare, ran = _both(tmp_path, argv, options=("--at", "30", "--steps", "3"))
    _same_output(bare, ran)
    assert ran.code == 0, ran.stderr[-3000:]
    _same_checkpoint(tmp_path / "bare" / "model.pt", tmp_path / "attached" / "model.pt")
    r = ran.result
    assert r["step_boundary"] == boundary
    assert r["steps"] == epochs * _train_batches(data, bsz, bptt)  # training batches: never evaluation forwards
    assert r["evaluation"]["periods"] == epochs  # each epoch's validation (the last one runs on into the final test)
    assert r["profiled_steps"] == [30, 32] and Path(r["trace"]).is_absolute() and Path(r["trace"]).exists()
    # the script's own clock: ms/batch over each log interval; ours: the same batches' steps
    per_epoch, ours, theirs = _train_batches(data, bsz, bptt), 0.0, 0.0
    steps = {row["step"]: row["step_ms"] for row in r["step_table"]}
    for epoch, batch, ms in _script_intervals(ran.script_stdout):
        first = (epoch - 1) * per_epoch + batch - 9 + 1  # batches batch-9 .. batch, as step numbers
        span = range(first, first + 10)
        if batch == 10 or any(30 <= n <= 32 for n in span):  # its start-up, or the profiled window
            continue
        ours += sum(steps[n] for n in span) / 10
        theirs += ms
    assert theirs > 0 and abs(ours - theirs) <= 0.15 * theirs, (ours, theirs)


def test_regression_manual_update_counts_its_batches(tmp_path):
    argv = [str(EXAMPLES / "seeded.py"), str(EXAMPLES / "regression" / "main.py")]
    bare, ran = _both(tmp_path, argv)
    _same_output(bare, ran)
    assert ran.code == 0, ran.stderr[-3000:]
    batches = int(re.search(r"after (\d+) batches", bare.stdout).group(1))
    r = ran.result
    assert r["step_boundary"] == "manual update" and r["steps"] == batches


def test_time_sequence_prediction_fails_as_it_does_bare(tmp_path):
    """LBFGS on a generated sine wave: where its imports or data fail, they fail the same attached."""
    gen = subprocess.run([sys.executable, str(EXAMPLES / "time_sequence_prediction" / "generate_sine_wave.py")],
                         cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    for d in ("bare", "attached"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "traindata.pt").write_bytes((tmp_path / "traindata.pt").read_bytes())
    argv = [str(EXAMPLES / "time_sequence_prediction" / "train.py"), "--steps", "2"]
    bare, ran = _run(tmp_path / "bare", argv, False), _run(tmp_path / "attached", argv, True)
    _same_output(bare, ran)
    if bare.code == 0:
        assert ran.result["step_boundary"] == "optimizer" and ran.result["steps"] == 2
    else:
        assert ran.result["status"] == "failed" and ran.result["exit_code"] == bare.code


def test_dcgan_two_optimizers_and_dataloader_workers_learn_and_save_as_bare(tmp_path):
    """dcgan on fake data (a torchvision stand-in: tests/data/pytorch_examples/shims), two DataLoader workers,
    the discriminator's and the generator's Adam each stepped once an iteration: one step per iteration."""
    size, batch, epochs = 48, 8, 2
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLES / 'shims'}", "FAKEDATA_SIZE": str(size)}
    argv = [str(EXAMPLES / "dcgan" / "main.py"), "--dataset", "fake", "--workers", "2", "--batchSize", str(batch),
            "--ngf", "8", "--ndf", "8", "--nz", "16", "--niter", str(epochs), "--manualSeed", "1", "--outf", "."]
    bare, ran = _both(tmp_path, argv, options=("--at", "4", "--steps", "3"), env=env)
    _same_output(bare, ran)
    assert ran.code == 0, ran.stderr[-3000:]
    assert "Loss_D" in bare.stdout
    for epoch in range(epochs):
        for net in ("netG", "netD"):
            name = f"{net}_epoch_{epoch}.pth"
            _same_checkpoint(tmp_path / "bare" / name, tmp_path / "attached" / name)
    r = ran.result
    assert r["step_boundary"] == "optimizer" and r["steps"] == epochs * math.ceil(size / batch)
    assert [o["type"] for o in r["optimizers"]] == ["Adam", "Adam"] and r["profiled_steps"] == [4, 6]
    assert r["workers"]["num_workers"] == 2

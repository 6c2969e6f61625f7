"""Imports torch, then fails before its first step (a missing file), exit code 1."""
import torch  # noqa: F401

open("/nonexistent/torchscope-test/data.bin")

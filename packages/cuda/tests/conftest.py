"""Run every Triton kernel under the interpreter when no CUDA device is present."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

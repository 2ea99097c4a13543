"""Where and in what precision the torch engine runs, decided once at start.

Every check that can fail does so here, at start-up, with a message naming the variable: a pod
with DEVICE=cuda on a node without a usable GPU must fail its start, not its first request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from predictor.errors import EngineError

log = logging.getLogger("predictor.device")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class DevicePlan:
    device: torch.device
    decoder_dtype: torch.dtype
    threads: int


def plan(device: str, dtype: str, threads: int, gpu_memory_fraction: float = 0.0) -> DevicePlan:
    """Resolve DEVICE/DTYPE/CPU_THREADS/GPU_MEMORY_FRACTION into a plan, applying process-wide knobs."""
    target = _device(device)
    decoder_dtype = _dtype(dtype, target)
    if target.type == "cuda":
        if gpu_memory_fraction:
            # PyTorch's caching allocator otherwise grows until it holds the whole card, starving any
            # neighbour sharing the GPU; past the cap, allocations fail in this process only.
            torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction, target.index)
        torch.cuda.set_device(target)
        if decoder_dtype is torch.float32:
            # cuDNN convolutions default to TensorFloat-32 on Ampere and later: 10-bit mantissas that
            # put fp32 audio ~1e-2 away from the CPU's. DTYPE=fp32 means fp32; bf16/fp16 are the fast path.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    elif gpu_memory_fraction:
        log.info("GPU_MEMORY_FRACTION=%s ignored on DEVICE=cpu", gpu_memory_fraction)
    # Intra-op threads drive the CPU parts (all of it on CPU; phonemes and glue on CUDA). One request
    # runs at a time, so inter-op parallelism would only oversubscribe the container's quota.
    torch.set_num_threads(threads)
    return DevicePlan(device=target, decoder_dtype=decoder_dtype, threads=threads)


def _device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise EngineError(
            f"DEVICE={device} but torch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'no'}, CUDA_VISIBLE_DEVICES={visible!r})"
        )
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    count = torch.cuda.device_count()
    if index >= count:
        # CUDA_VISIBLE_DEVICES renumbers the visible cards from 0.
        raise EngineError(
            f"DEVICE={device} but only {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def _dtype(dtype: str, target: torch.device) -> torch.dtype:
    chosen = DTYPES[dtype]
    if target.type == "cpu" and chosen is torch.float16:
        raise EngineError("DTYPE=fp16 needs DEVICE=cuda: CPU kernels for half precision are slow or missing")
    if target.type == "cuda" and chosen is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise EngineError(
            f"DTYPE=bf16 but {torch.cuda.get_device_name(target)} has no bf16 support; use fp16"
        )
    return chosen

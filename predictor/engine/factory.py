"""Construct the configured engine (ENGINE, DEVICE, DTYPE, COMPILE) without weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.engine.base import Engine
from predictor.errors import EngineError

if TYPE_CHECKING:
    from predictor.config import Settings


def create(settings: Settings, threads: int | None = None) -> Engine:
    """Construct the configured engine without weights (device and imports checked here, at start),
    with ``threads`` intra-op threads (default: one worker's share, Settings.worker_threads)."""
    threads = settings.worker_threads() if threads is None else threads
    if settings.engine_name == "torch":
        try:
            from predictor.engine.native import TorchEngine
        except ImportError as exc:
            from predictor.config import ConfigError

            raise ConfigError(
                f"ENGINE=torch needs torch, which this install lacks ({exc}): install the native extra, "
                "pip install 'tts-predictor[native]' (the GPU image has it; the CPU image runs ENGINE=onnx)"
            ) from None

        return TorchEngine(
            device=settings.device,
            dtype=settings.dtype,
            threads=threads,
            gpu_memory_fraction=settings.gpu_memory_cap or 0.0,
            compile=settings.compile,
        )
    if settings.engine_name == "onnx":
        from predictor.engine.exported import OnnxEngine

        if settings.dtype != "fp32" or settings.compile:
            raise EngineError("DTYPE and COMPILE apply to ENGINE=torch only")
        return OnnxEngine(device=settings.device, threads=threads)
    raise EngineError(f"unknown engine {settings.engine!r}")

"""`python -m bench gpu [--device cuda|cpu] [--small] [--no-compile]`: the torch engine on a GPU, one table.

Rows, each against a baseline measured in the same run:
  * parity: fp32 on the device vs fp32 on CPU (max |diff| <= 1e-3, noise off); bf16 and fp16 decoders
    vs fp32 on the device (identical durations, correlation > 0.99);
  * throughput, audio seconds per second, at batch 1, 4, 16 and 32 (vs batch 1) and RTF;
  * first packet with chunked decoding vs the whole sentence;
  * exec -> ready cold start with DEVICE=<device>, with and without COMPILE=1 (CUDA init, load, warm-up);
  * GPU memory used by the engine at batch 32 (peak allocated) and that GPU_MEMORY_FRACTION is enforced
    (an allocation past the cap fails in that process).

Made to finish in under 8 minutes on one GPU. `--device cpu --small` is the dry run `make test` runs
(tests/system/test_bench_gpu.py): every row is computed on CPU with small sizes, GPU-only rows say n/a.
TF32 stays off for fp32 (device.plan turns cuDNN's off), so fp32 parity is about the model, not
TensorFloat-32 rounding.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, Predictor, Row, Session, SuiteResult, log, median

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Serverless speech has to be fast from the very first request.",
    "At three o'clock on the twelfth of May, the canary received ten percent of the traffic.",
    "Scale to zero when idle, and answer quickly when called again.",
    "A longer sentence, with commas, clauses, and pauses, tests the duration predictor on varied rhythm.",
    "Numbers like forty two are read out in full.",
    "Short one.",
    "Time to first audio is what a listener notices, long before the total.",
]
LONG_SENTENCE = (
    "When the evening train finally pulled into the quiet station at the edge of the valley, the travellers "
    "gathered their bags and stepped out into the cold air that smelled of pine and rain."
)
RESULTS = REPO / "bench" / "results" / "gpu.json"


def _engine(model_dir: Path, device: str, dtype: str = "fp32") -> Any:
    from predictor.engine.native import TorchEngine

    engine = TorchEngine(device=device, dtype=dtype, threads=2, gpu_memory_fraction=0.0, compile=False)
    engine.load(model_dir)
    engine.warmup("Warming up the voice.")
    return engine


def _latent_and_audio(engine: Any, text: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(durations, audio) of one sentence with zero noise, straight from the model."""
    import torch

    from predictor.engine import phonemes

    voice = engine.voice
    ids = next(iter(phonemes.sentence_ids(text, voice.espeak_voice, voice.phoneme_id_map)))
    device = engine.plan.device
    with torch.inference_mode():
        out = engine._model.infer(
            torch.tensor([ids], device=device),
            torch.tensor([len(ids)], device=device),
            noise_scale=0.0,
            length_scale=1.0,
            noise_w=0.0,
            generator=torch.Generator(device=device).manual_seed(seed),
        )
    return out.durations.cpu().numpy(), out.audio[0, : int(out.audio_lengths[0])].cpu().numpy()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _parity(
    res: SuiteResult, model_dir: Path, device: str, cpu_engine: Any, dev_engine: Any, texts: list[str]
) -> None:
    worst = 0.0
    for k, text in enumerate(texts):
        _, a = _latent_and_audio(cpu_engine, text, k)
        _, b = _latent_and_audio(dev_engine, text, k)
        n = min(len(a), len(b))
        worst = max(worst, float(np.abs(a[:n] - b[:n]).max()) if len(a) == len(b) else float("inf"))
    res.rows.append(
        Row("gpu", f"fp32 {device} vs cpu, max |diff|", worst, "", goal="<= 1e-3", met=worst <= 1e-3)
    )
    lowered = ["bf16", "fp16"] if device.startswith("cuda") else ["bf16"]
    for dtype in lowered:
        low = _engine(model_dir, device, dtype)
        same, corr = True, 1.0
        for k, text in enumerate(texts):
            d32, a32 = _latent_and_audio(dev_engine, text, k)
            dlo, alo = _latent_and_audio(low, text, k)
            same = same and np.array_equal(d32, dlo)
            corr = min(corr, float(np.corrcoef(a32, alo)[0, 1])) if len(a32) == len(alo) else 0.0
        res.rows.append(
            Row(
                "gpu",
                f"{dtype} vs fp32 on {device}, min correlation",
                corr,
                "",
                goal="> 0.99, same durations",
                met=corr > 0.99 and same,
                note="" if same else "durations differ",
            )
        )
        del low


def _throughput(res: SuiteResult, engine: Any, device: str, batches: list[int], rounds: int) -> None:
    from predictor.engine.base import SynthesisParams

    params = SynthesisParams(noise_scale=0.667, noise_w=0.8)
    rates: dict[int, float] = {}
    for batch in batches:
        texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
        # One forward pass for the whole batch, whatever the device (the engine's own cap is
        # config.CUDA_BATCH_SIZE on CUDA).
        engine.sentences_per_batch = batch
        engine.synthesize(texts, params)  # kernels for this shape
        walls, audio_s = [], 0.0
        for _ in range(rounds):
            _sync(device)
            start = time.perf_counter()
            audio = engine.synthesize(texts, params)
            _sync(device)
            walls.append(time.perf_counter() - start)
            audio_s = sum(len(a) for a in audio) / engine.sample_rate
        rates[batch] = audio_s / median(walls)
        base = rates[batches[0]]
        res.rows.append(
            Row(
                "gpu",
                f"throughput batch {batch}",
                rates[batch],
                "audio s/s",
                baseline_name=f"batch {batches[0]}",
                baseline=base,
                ratio=rates[batch] / base,
            )
        )
    rtf = 1.0 / rates[batches[0]]
    res.rows.append(Row("gpu", "RTF batch 1", rtf, "", goal="< 1", met=rtf < 1))


def _first_packet(res: SuiteResult, engine: Any, device: str, rounds: int) -> None:
    from predictor.engine.base import StreamWindows, SynthesisParams

    params = SynthesisParams(noise_scale=0.667, noise_w=0.8)
    sizes = StreamWindows(24, 192)
    firsts, wholes = [], []
    list(engine.stream(LONG_SENTENCE, params, sizes))  # kernels for these shapes, both paths
    engine.synthesize([LONG_SENTENCE], params)
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        pieces = engine.stream(LONG_SENTENCE, params, sizes)
        next(pieces)
        _sync(device)
        firsts.append(time.perf_counter() - start)
        pieces.close()
        start = time.perf_counter()
        engine.synthesize([LONG_SENTENCE], params)
        _sync(device)
        wholes.append(time.perf_counter() - start)
    first, whole = median(firsts), median(wholes)
    res.rows.append(
        Row(
            "gpu",
            "first packet, chunked (30 words)",
            first * 1000,
            "ms",
            baseline_name="whole",
            baseline=whole * 1000,
            ratio=first / whole,
            goal="<= 0.3x",
            met=first / whole <= 0.3,
        )
    )


def _cold_starts(res: SuiteResult, session: Session, device: str, compiled: bool) -> None:
    variants = [("eager", {})] + ([("COMPILE=1", {"COMPILE": "1"})] if compiled else [])
    base = None
    for name, env in variants:
        p = Predictor(session, session.path("model"), ENGINE="torch", DEVICE=device, **env)
        try:
            ready = p.wait_ready(timeout=400)
            phases = p.cold_start_metrics()
        finally:
            p.stop()
        base = base or ready
        res.rows.append(
            Row(
                "gpu",
                f"cold start exec->ready DEVICE={device} {name}",
                ready,
                "s",
                baseline_name="eager",
                baseline=base,
                ratio=ready / base,
                note=", ".join(f"{k} {v:.2f} s" for k, v in sorted(phases.items())),
            )
        )


def _memory(res: SuiteResult, device: str) -> None:
    if not device.startswith("cuda"):
        res.rows.append(Row("gpu", "GPU memory, peak allocated", 0.0, "MiB", note="n/a on CPU"))
        res.rows.append(Row("gpu", "GPU_MEMORY_FRACTION enforced", 0.0, "", note="n/a on CPU"))
        return
    import torch

    peak = torch.cuda.max_memory_allocated() / 2**20
    res.rows.append(Row("gpu", "GPU memory, peak allocated (batch 32 included)", peak, "MiB"))
    # In a fresh process (the cap is per process): the engine's device plan with a 5 % cap, then an
    # allocation of 10 % of the card must fail while one of 1 % succeeds.
    probe = (
        "import torch, sys\n"
        "from predictor.engine.device import plan\n"
        f"plan({device!r}, 'fp32', 1, 0.05)\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "torch.empty(int(total * 0.01), dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.empty(int(total * 0.10), dtype=torch.uint8, device='cuda')\n"
        "except torch.cuda.OutOfMemoryError:\n"
        "    print('refused'); sys.exit(0)\n"
        "print('allowed')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    enforced = out.stdout.strip() == "refused"
    res.rows.append(
        Row(
            "gpu",
            "GPU_MEMORY_FRACTION=0.05: 10 % of the card refused",
            1.0 if enforced else 0.0,
            "",
            goal="refused",
            met=enforced,
            note=(out.stdout + out.stderr).strip()[-200:],
        )
    )


def run(session: Session, device: str = "cuda", small: bool = False, compiled: bool = True) -> SuiteResult:
    from predictor.artifact.fetch import fetch

    res = SuiteResult()
    model_dir = session.path("model")
    fetch(session.voice, model_dir, engine="torch")
    if device.startswith("cuda"):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    texts = SENTENCES[:2] if small else SENTENCES
    batches = [1, 2] if small else [1, 4, 16, 32]
    rounds = 1 if small else 3
    log("gpu: engines")
    cpu_engine = _engine(model_dir, "cpu")
    dev_engine = cpu_engine if device == "cpu" else _engine(model_dir, device)
    log("gpu: parity")
    _parity(res, model_dir, device, cpu_engine, dev_engine, texts)
    log("gpu: throughput")
    _throughput(res, dev_engine, device, batches, rounds)
    log("gpu: first packet")
    _first_packet(res, dev_engine, device, rounds)
    _memory(res, device)
    del dev_engine, cpu_engine
    log("gpu: cold starts")
    _cold_starts(res, session, device, compiled)
    return res


def main(argv: list[str] | None = None) -> int:
    from contextlib import ExitStack

    from bench.__main__ import table

    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the dry run)")
    parser.add_argument("--small", action="store_true", help="two sentences, batches 1-2, one round")
    parser.add_argument("--no-compile", action="store_true", help="skip the COMPILE=1 cold start")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with ExitStack() as stack:
        res = run(Session(stack), device=args.device, small=args.small, compiled=not args.no_compile)
    print()
    print(table(res.rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"device": args.device, **res.to_json()}, indent=2, default=str) + "\n")
    print(f"\nwrote {RESULTS.relative_to(REPO)} ({time.perf_counter() - started:.0f} s in all)")
    # The dry run checks that the script works; its goals are the GPU's (a shared CPU misses them).
    return 0 if args.device == "cpu" or all(r.met is not False for r in res.rows) else 1

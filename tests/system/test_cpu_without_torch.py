"""The CPU install without torch (the CPU image): the onnxruntime path never imports torch, and
ENGINE=torch is a start-up error naming the extra. A child interpreter with torch made unimportable
stands in for an install without the native extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testing.artifacts import as_published_before_noise_and_durations

BLOCK_TORCH = "import sys; sys.modules['torch'] = None; sys.modules['safetensors'] = None\n"


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "check.py"
    script.write_text(BLOCK_TORCH + textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("engine", ["onnx", "auto"])
def test_the_onnx_engine_serves_without_torch(voice_dir: Path, tmp_path: Path, engine: str):
    done = _run(
        f"""
        import sys
        from pathlib import Path
        import predictor.server
        from predictor.config import load_settings
        from predictor.engine.base import SynthesisParams
        from predictor.engine.factory import create
        from predictor.engine.windows import decoder_context_frames
        e = create(load_settings(engine={engine!r}, cpu_threads=1))
        e.load(Path({str(voice_dir)!r}))
        audio = e.synthesize(["Hello without torch."], SynthesisParams())
        print(type(e).__name__, len(audio[0]))
        """,
        tmp_path,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    name, samples = done.stdout.split()
    assert name == "OnnxEngine" and int(samples) > 10_000


def test_an_artifact_published_before_the_encoder_rewrites_loads_and_seeds_without_torch(
    voice_dir: Path, tmp_path: Path
):
    # Found by the e2e cluster: the CPU image could not load such an artifact ("No module named
    # 'torch'") while the rewrites lived beside the torch conversion.
    old = as_published_before_noise_and_durations(voice_dir, tmp_path / "old-voice")
    done = _run(
        f"""
        from pathlib import Path
        from predictor.engine.base import SynthesisParams
        from predictor.engine.exported import OnnxEngine
        e = OnnxEngine(device="cpu", threads=1)
        e.load(Path({str(old)!r}))
        ((audio, words),) = e.align_checked(["Old voices still speak."], SynthesisParams(seed=4))
        print(len(audio), len(words))
        """,
        tmp_path,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    samples, words = done.stdout.split()
    assert int(samples) > 10_000 and int(words) == 4


def test_engine_torch_without_torch_is_a_start_error_naming_the_extra(tmp_path: Path):
    done = _run(
        """
        from predictor.config import ConfigError, load_settings
        from predictor.engine.factory import create
        try:
            create(load_settings(engine="torch", cpu_threads=1))
        except ConfigError as exc:
            print(exc)
        """,
        tmp_path,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert "ENGINE=torch needs torch" in done.stdout and "tts-predictor[native]" in done.stdout

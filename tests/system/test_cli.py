"""The command line: publish, fetch, synth, and the image's Dockerfile lint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from testing.audio import check_samples
from testing.predictor import run_cli as cli
from testing.predictor import run_synth
from testing.s3 import aws_env

ROOT = Path(__file__).resolve().parents[2]


def test_publish_then_fetch_round_trip(s3_server, tmp_path):
    env = aws_env(s3_server)

    published = cli("publish", "--to", "s3://cli-voices/joe", "--endpoint-url", s3_server, env=env)
    fetched = cli("fetch", "s3://cli-voices/joe", str(tmp_path / "model"), env=env)
    again = cli("fetch", "s3://cli-voices/joe", str(tmp_path / "model"), env=env)

    assert published.returncode == 0, published.stderr
    assert fetched.returncode == 0, fetched.stderr
    # model.onnx, config, card, safetensors, vits.json, prior, the flow's four coupling layers, decoder
    # head and tail
    assert "12 downloaded" in fetched.stdout
    assert "0 downloaded, 12 already verified" in again.stdout
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["name"] == "en_US-joe-medium"


def test_fetch_for_one_engine_skips_the_other_engines_weights(s3_server, tmp_path):
    env = aws_env(s3_server)
    cli("publish", "--to", "s3://cli-voices/joe-onnx", "--endpoint-url", s3_server, env=env)

    fetched = cli("fetch", "s3://cli-voices/joe-onnx", str(tmp_path / "model"), "--engine", "onnx", env=env)

    assert fetched.returncode == 0, fetched.stderr
    assert "10 downloaded" in fetched.stdout  # config, card, vits.json and the graph's seven parts
    parts = ("prior", "flow_0", "flow_1", "flow_2", "flow_3", "decoder_head", "decoder_tail")
    assert all((tmp_path / "model" / f"{part}.onnx").exists() for part in parts)
    assert not (tmp_path / "model" / "model.safetensors").exists()
    assert not (tmp_path / "model" / "model.onnx").exists()  # Piper's whole graph: no engine of ours reads it


def test_fetch_of_missing_artifact_fails_with_reason(s3_server, tmp_path):
    run = cli("fetch", "s3://cli-voices/absent", str(tmp_path / "model"), env=aws_env(s3_server))

    assert run.returncode == 1
    assert "manifest.json" in run.stderr


def test_synth_writes_the_engines_speech_to_a_wav_file(voice_dir, reference, tmp_path):
    out = tmp_path / "hello.wav"

    run = run_synth(voice_dir, "Hello from the command line.", out)

    assert run.returncode == 0, run.stderr
    audio, rate = soundfile.read(out, dtype="float32")
    assert rate == 22050
    check_samples(audio, reference.speak("Hello from the command line."))  # a float WAV: every sample
    assert not list(tmp_path.glob(".*.part")), "the temporary file was left behind"


def test_console_script_is_installed():
    script = shutil.which("tts-predictor", path=str(Path(sys.executable).parent))

    run = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)

    assert run.returncode == 0 and "serve" in run.stdout and "publish" in run.stdout


def test_ops_console_script_is_installed_with_the_offline_commands():
    script = shutil.which("tts-ops", path=str(Path(sys.executable).parent))

    run = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)

    assert run.returncode == 0, run.stderr
    assert all(name in run.stdout for name in ("compare", "profile", "simulate", "manifests", "image"))


@pytest.mark.parametrize("command", ["compare", "profile", "simulate"])
def test_a_command_moved_to_tts_ops_exits_2_saying_where_it_went(command, capsys):
    from predictor import cli as runtime_cli

    code = runtime_cli.main([command, "--stable", "x", "--canary", "y"])

    assert code == 2
    assert f"`tts-ops {command}`" in capsys.readouterr().err


def test_dockerfile_is_clean_under_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")

    run = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)

    assert run.returncode == 0, run.stdout + run.stderr


def test_settings_doc_documents_every_setting():
    from predictor.config import Settings

    reference = (ROOT / "docs" / "settings.md").read_text()

    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in reference]
    assert not missing, f"docs/settings.md lacks {missing}"


def test_observability_doc_documents_every_metric():
    from prometheus_client.metrics import MetricWrapperBase

    from predictor.observability import metrics

    reference = (ROOT / "docs" / "observability.md").read_text()
    names = [m._name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]

    missing = [n for n in names if n not in reference]
    assert names and not missing, f"docs/observability.md's metrics table lacks {missing}"

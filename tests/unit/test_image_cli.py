"""`make image`'s command line reaches tts_ops.image intact, with IMAGE_ARGS empty or not."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tts_ops.image import parse_args

REPO = Path(__file__).resolve().parents[2]


def _make_image_argv(*make_args: str) -> list[str]:
    # -n prints the recipe without running it (nor the build it starts).
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "image", *make_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [line for line in out.splitlines() if "tts_ops.image build" in line]
    argv = shlex.split(line)
    return argv[argv.index("tts_ops.image") + 1 :]


def test_make_image_with_image_args_empty_builds_with_no_extra_arguments():
    args = parse_args(_make_image_argv("IMAGE_ARGS="))

    assert (args.command, args.tag, args.extra) == ("build", "tts-predictor:dev", [])


def test_make_image_passes_image_args_to_the_build():
    args = parse_args(_make_image_argv("IMAGE_ARGS=--build-arg EXTRAS=native", "IMAGE=x:1"))

    assert (args.tag, args.extra) == ("x:1", ["--build-arg", "EXTRAS=native"])


@pytest.mark.parametrize("argv", [["build", "--"], ["build"]])
def test_a_trailing_double_dash_is_no_extra_arguments(argv):
    assert parse_args(argv).extra == []

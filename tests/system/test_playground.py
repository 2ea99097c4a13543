"""The playground page and the HTML reports, in a real browser: Debian's chromium driven by Playwright.

The page talks to a real predictor over a real socket; what it played is checked as audio. Screenshots
land in .cache/screenshots/ (not committed) for a person to look at.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile

from testing.audio import speech_problems
from testing.bodies import speech_request
from testing.predictor import PredictorProcess, run_cli
from testing.process import REPO
from testing.records import SR, shadow_record, voiced, write_jsonl
from tts_ops import cli as ops_cli

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox: the tests run as root in a container. The rest keeps the browser off the network and
# quiet: nothing may be fetched here, and background requests would only add noise to the console.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = REPO / ".cache" / "screenshots"
THREE_SENTENCES = (
    "The first sentence is short. Here is a second sentence, a little longer than the first one. "
    "And a third sentence closes the paragraph."
)
MAX_CHARS = 400  # MAX_STREAM_TEXT_CHARS of the playground predictor: an over-long text is cheap to type
SPEECH_TIMEOUT_MS = 180_000  # three sentences on one shared CPU core, with a margin


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make system-packages` (Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Console:
    """Errors the page logged (a failed load among them) or threw."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    yield context.new_page()
    context.close()


@pytest.fixture
def console(page) -> Console:
    return Console(page)


@pytest.fixture(scope="module")
def playground(start_predictor) -> PredictorProcess:
    return start_predictor(PLAYGROUND="true", MAX_STREAM_TEXT_CHARS=str(MAX_CHARS))


def open_playground(page, playground: PredictorProcess) -> None:
    response = page.goto(playground.url + "/")
    assert response.status == 200
    page.wait_for_function("() => window.playground.ready", timeout=30_000)


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def events(page) -> dict[str, float]:
    """First time of each event the page recorded (performance.now(), ms)."""
    out: dict[str, float] = {}
    for event in page.evaluate("() => window.playground.events"):
        out.setdefault(event["name"], event["t"])
    return out


# --- the playground ----------------------------------------------------------------------------
def test_three_sentences_start_playing_before_the_response_ends_and_download_as_speech(
    page, console, playground
):
    from playwright.sync_api import expect

    open_playground(page, playground)
    page.fill("#text", THREE_SENTENCES)

    page.click("#speak")

    expect(page.locator("#state")).to_have_text("done", timeout=SPEECH_TIMEOUT_MS)
    seen = events(page)
    assert seen["request-start"] < seen["first-chunk"] <= seen["first-audio"] < seen["response-end"], seen
    assert seen["response-end"] < seen["played"]
    first_audio_ms = float(page.text_content("#first-audio-ms"))
    assert 0 < first_audio_ms < seen["response-end"] - seen["request-start"]
    with page.expect_download() as download:
        page.click("#download")
    audio, rate = soundfile.read(download.value.path(), dtype="float32")
    # The same text from the same server, whole: how long this voice speaks it.
    whole = playground.post("/v1/audio/speech", json=speech_request(THREE_SENTENCES, "wav"), timeout=120)
    reference, _ = soundfile.read(io.BytesIO(whole.content), dtype="float32")
    assert rate == SR
    assert speech_problems(audio, rate, seconds=len(reference) / SR) == []
    shown = float(page.text_content("#audio-seconds").split()[0])
    assert shown == pytest.approx(len(audio) / rate, abs=0.01)
    assert console.errors == []
    screenshot(page, "playground-after-speaking.png")


def test_the_audio_check_rejects_silence_noise_and_the_wrong_length():
    speech = voiced(0, seconds=3.0)
    noise = np.random.default_rng(0).normal(0, 0.1, len(speech)).astype(np.float32)

    assert speech_problems(speech, SR, seconds=3.0) == []
    assert "silent" in " ".join(speech_problems(speech * 0.001, SR, seconds=3.0))
    assert "flat like noise" in " ".join(speech_problems(noise, SR, seconds=3.0))
    assert "expected 6.00 s" in " ".join(speech_problems(speech, SR, seconds=6.0))


def test_ctrl_enter_speaks_from_the_keyboard(page, playground):
    from playwright.sync_api import expect

    open_playground(page, playground)
    page.focus("#text")
    page.keyboard.press("Control+A")
    page.keyboard.type("Spoken from the keyboard.")

    page.keyboard.press("Control+Enter")

    expect(page.locator("#state")).to_have_text("done", timeout=SPEECH_TIMEOUT_MS)
    assert re.fullmatch(r"\d+", page.text_content("#first-audio-ms"))


def test_every_control_has_a_label_and_a_narrow_window_does_not_scroll_sideways(page, playground):
    open_playground(page, playground)
    unlabelled = page.evaluate(
        "() => [...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => e.labels.length === 0).map(e => e.id)"
    )

    page.set_viewport_size({"width": 320, "height": 700})

    assert unlabelled == []
    for name in ("Text", "Voice", "Format", "Speed"):
        assert page.get_by_label(name, exact=True).count() == 1, name
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 320
    assert page.locator("#speak").bounding_box()["x"] + page.locator("#speak").bounding_box()["width"] <= 320
    screenshot(page, "playground-narrow.png")


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "input is empty"), ("a" * (MAX_CHARS + 1), "MAX_STREAM_TEXT_CHARS")],
    ids=["empty", "over-long"],
)
def test_server_errors_show_their_message(page, playground, text, message):
    from playwright.sync_api import expect

    open_playground(page, playground)
    page.fill("#text", text)

    page.click("#speak")

    expect(page.locator("#state")).to_have_text("error", timeout=30_000)
    expect(page.locator("#error")).to_contain_text(message)
    assert page.is_visible("#error") and page.text_content("#first-audio-ms") == ""


def test_without_playground_the_page_is_404(page, predictor):
    response = page.goto(predictor.url + "/playground")

    assert response.status == 404
    assert predictor.get("/playground/playground.js").status_code == 404
    # `/` stays KServe's (a liveness answer, JSON), not the page.
    assert "text/html" not in predictor.get("/").headers.get("content-type", "")


# --- reports as pages ----------------------------------------------------------------------------
N_RECORDS = 30


def _records(tmp_path: Path, canary_latency_s: float) -> tuple[Path, Path]:
    stable = write_jsonl(
        tmp_path / "stable.jsonl",
        [shadow_record(f"r{i}", "stable", voiced(i), latency_s=0.4 + 0.01 * i) for i in range(N_RECORDS)],
    )
    canary = write_jsonl(
        tmp_path / "canary.jsonl",
        [
            shadow_record(f"r{i}", "canary", voiced(i), latency_s=canary_latency_s + 0.01 * i)
            for i in range(N_RECORDS)
        ],
    )
    return stable, canary


@pytest.mark.parametrize(("canary_latency_s", "verdict"), [(0.4, "PASS"), (0.8, "FAIL")])
def test_compare_html_opens_without_console_errors_and_shows_the_verdict(
    page, console, tmp_path, capsys, canary_latency_s, verdict
):
    stable, canary = _records(tmp_path, canary_latency_s)
    out = tmp_path / "report" / "verdict.html"

    code = ops_cli.main(["compare", "--stable", str(stable), "--canary", str(canary), "--html", str(out)])

    capsys.readouterr()
    assert code == (0 if verdict == "PASS" else 1)
    assert [p.name for p in out.parent.iterdir()] == ["verdict.html"], "a temporary file was left behind"
    html = out.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the report loads something from outside"
    page.goto(out.as_uri())
    assert page.text_content("#verdict") == verdict
    thresholds = page.locator("table:has(caption:text-is('Thresholds'))")
    assert thresholds.locator("tbody tr").count() == 10  # 8 + MOS P.808 and OVRL (n/a: off, no scores)
    p50 = thresholds.locator("tbody tr:has(td:text-is('latency p50'))")
    assert p50.locator("td").last.text_content() == verdict
    assert "--max-p50-increase" in p50.text_content()
    image = page.locator("figure img")
    assert image.evaluate("img => img.complete && img.naturalWidth") > 500
    assert console.errors == []
    screenshot(page, f"compare-{verdict.lower()}.png")


def test_simulate_html_shows_the_summary_and_the_timeline(page, console, tmp_path):
    out = tmp_path / "simulation.html"

    result = run_cli(
        "simulate",
        "--manifests",
        str(REPO / "keda" / "overlays" / "cpu"),
        "--trace",
        "poisson:rate=1,duration=120",
        "--html",
        str(out),
        module="tts_ops",
    )

    assert result.returncode == 0, result.stderr
    page.goto(out.as_uri())
    assert page.locator("tr:has(td:text-is('replica_seconds'))").count() == 1
    assert page.locator("figure img").evaluate("img => img.complete && img.naturalWidth") > 500
    assert console.errors == []
    screenshot(page, "simulate.png")

"""Event safety: an oversized inline reply refused before synthesis, an inline redelivery answered with the
same audio, and outputs written only under CE_OUTPUT_PREFIXES, against a real predictor and moto."""

from __future__ import annotations

import base64
import json
import time

import pytest

# Not predictor.events.cloudevents: it loads KServe's protobuf stubs, which clash with Triton's in
# this process (other test modules use those).
from predictor import text
from predictor.audio import codecs
from predictor.config import ConfigError, load_settings
from testing.s3 import s3_client

REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"
PROSE = (
    "The committee met on a grey Tuesday morning, reviewed the budget line by line, and agreed, "
    "after a long and sometimes heated discussion, to postpone the vote until spring."
)


def send(predictor, event_id: str, data: dict, source: str = "/tests/event-safety"):
    headers = {
        "ce-specversion": "1.0",
        "ce-type": REQUEST_TYPE,
        "ce-source": source,
        "ce-id": event_id,
        "content-type": "application/json",
    }
    return predictor.post("/v1/models/tts:predict", headers=headers, content=json.dumps(data))


def syntheses(predictor) -> float:
    return predictor.metric("tts_synthesis_seconds_count")


def test_inline_event_whose_audio_may_exceed_the_limit_is_refused_before_synthesis(predictor):
    before = syntheses(predictor)
    started = time.monotonic()

    response = send(predictor, "too-long-inline", {"text": "Spoken at length. " * 100})

    assert response.status_code == 413, response.text
    assert "CE_INLINE_MAX_BYTES" in response.json()["error"] and "data.output" in response.json()["error"]
    assert syntheses(predictor) == before  # nothing was synthesized
    assert time.monotonic() - started < 5  # answered from the text alone


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_the_inline_bound_is_above_the_real_size_for_prose(predictor, fmt):
    response = send(predictor, f"bound-{fmt}", {"text": PROSE, "format": fmt})
    reply = response.json()

    # What the predictor computes before synthesis (events.cloudevents.inline_size_bound).
    bound = codecs.encoded_size_bound(text.spoken_seconds_bound(PROSE), codecs.FORMATS[fmt], 22050)

    assert response.status_code == 200, response.text
    assert reply["bytes"] <= bound, (reply["bytes"], bound)


def test_inline_redelivery_of_the_same_event_gets_the_same_audio(predictor):
    first = send(predictor, "redelivered-inline", {"text": "Retried by the broker."})
    again = send(predictor, "redelivered-inline", {"text": "Retried by the broker."})
    other = send(predictor, "another-inline", {"text": "Retried by the broker."})

    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json()["sha256"] == again.json()["sha256"]
    assert base64.b64decode(first.json()["audio_base64"]) == base64.b64decode(again.json()["audio_base64"])
    assert other.json()["sha256"] != first.json()["sha256"]  # another event: other noise


@pytest.mark.parametrize(
    "output",
    [
        "s3://event-outputs/elsewhere/x.wav",
        "s3://event-outputs/jobs-lookalike/x.wav",
        "s3://some-other-bucket/jobs/x.wav",
        "s3://event-outputs/jobs/../secrets/x.wav",
    ],
    ids=["other prefix", "prefix lookalike", "other bucket", "dot segments"],
)
def test_output_outside_the_configured_prefixes_is_refused_and_nothing_is_written(
    predictor, s3_server, output
):
    client = s3_client(s3_server)
    if "event-outputs" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="event-outputs")
    before = syntheses(predictor)

    response = send(predictor, f"outside-{output}", {"text": "Not here.", "output": output})

    assert response.status_code in (400, 403), response.text
    assert response.status_code == 403 or "segments" in response.json()["error"]
    listing = client.list_objects_v2(Bucket="event-outputs").get("Contents", [])
    assert not [o for o in listing if not o["Key"].startswith("jobs/")]
    assert syntheses(predictor) == before


def test_output_prefixes_that_are_not_s3_locations_fail_at_start():
    with pytest.raises(ConfigError, match="CE_OUTPUT_PREFIXES"):
        load_settings(ce_output_prefixes="s3://ok/prefix,http://example.com/x")

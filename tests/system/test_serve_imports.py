"""What `serve` imports: KServe's pandas and Kubernetes client stay unloaded through every protocol.

The predictor runs with PYTHONPROFILEIMPORTTIME=1, so the interpreter itself writes a line to stderr
(our log file) for every module it imports, at start-up or at any later request.
"""

from __future__ import annotations

import json
import re

import numpy as np
import tritonclient.grpc as triton_grpc

from testing.bodies import cloudevent_headers, speech_request, v1_request, v2_request

SENTENCE = "Nothing of pandas is needed to speak."
# The self time is negative where the import's children ran on another thread meanwhile (cold start
# imports the engine's packages on its own threads beside the server's): 'import time: -24220 | ...'.
IMPORTED = re.compile(r"^import time:\s+-?\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


def test_serving_every_protocol_never_imports_pandas_or_the_kubernetes_client(start_predictor):
    p = start_predictor(ENGINE="auto", LOG_FORMAT="text", PYTHONPROFILEIMPORTTIME="1")

    answers = [
        p.post("/v2/models/tts/infer", json=v2_request(SENTENCE)),
        p.post("/v1/models/tts:predict", json=v1_request(SENTENCE)),
        p.post("/v1/audio/speech", json=speech_request(SENTENCE, response_format="wav")),
        p.post("/v1/audio/speech", json=speech_request(SENTENCE, stream=True)),
        p.post(
            "/v1/models/tts:predict",
            headers=cloudevent_headers("imports-1"),
            content=json.dumps({"text": SENTENCE, "format": "wav"}),
        ),
        p.get("/v2/models/tts"),
        p.get("/v2/models/tts/ready"),
        p.get("/metrics"),
        p.get("/openapi.json"),
    ]
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([SENTENCE.encode()], dtype=object))
    grpc_answer = triton_grpc.InferenceServerClient(p.grpc).infer("tts", [text])

    assert [a.status_code for a in answers] == [200] * len(answers), [a.text[:200] for a in answers]
    assert grpc_answer.as_numpy("audio").size > 10_000
    imported = set(IMPORTED.findall(p.logs()))
    # The profile covers the server's own imports, so a missing line means a missing module.
    assert {"kserve", "kserve.protocol.infer_type", "onnxruntime"} <= imported, sorted(imported)[:20]
    loaded = sorted(m for m in imported if m.split(".")[0] in {"pandas", "kubernetes"})
    assert not loaded, loaded

"""One request on Triton's ModelStreamInfer, as a client sends it: every response (or the stream's
error) it got, in order."""

from __future__ import annotations

from typing import Any

import numpy as np


def stream_one(target: str, text: str, headers: dict[str, str] | None = None, **infer: Any) -> list:
    """Open a stream to ``target``, send ``text`` as input ``text`` (``infer``: async_stream_infer's
    parameters, outputs, request_id), close it once answered, and return what came back: results, or
    exceptions for the errors."""
    import tritonclient.grpc as triton_grpc

    results: list = []
    client = triton_grpc.InferenceServerClient(target)
    client.start_stream(callback=lambda result, error: results.append(error or result), headers=headers)
    inp = triton_grpc.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    client.async_stream_infer("tts", [inp], **infer)
    client.stop_stream()
    return results

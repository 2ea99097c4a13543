"""Runs KServe's own v2 clients (REST and gRPC) against a predictor; prints what they got as JSON.

Used by tests/system/test_protocol.py in a subprocess: KServe's gRPC stubs and Triton's cannot share
a process, so no test imports this module.
Usage: python testing/kserve_clients.py HTTP_URL GRPC_TARGET TEXT
"""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def request(text: str) -> InferRequest:
    tensor = InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object), binary_data=False)
    return InferRequest(model_name="tts", infer_inputs=[tensor], parameters={"noise_scale": 0, "noise_w": 0})


async def main(url: str, target: str, text: str) -> dict:
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        via_rest = await rest.infer(url, request(text), model_name="tts")
    finally:
        await rest.close()
    grpc_client = InferenceGRPCClient(target, timeout=60)
    try:
        via_grpc = await grpc_client.infer(request(text))
    finally:
        await grpc_client.close()
    a = {o.name: o.as_numpy() for o in via_rest.outputs}
    b = {o.name: o.as_numpy() for o in via_grpc.outputs}
    return {
        "rest_shape": list(a["audio"].shape),
        "grpc_shape": list(b["audio"].shape),
        "rest_length": int(a["audio_length"][0]),
        "identical": bool(np.array_equal(a["audio"], b["audio"])),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))

"""The predictor as KServe's model registry and gRPC servicer see it (kserve.Model): readiness from the
service, ModelInfer decoded, synthesized and encoded with the v2 codec."""

from __future__ import annotations

from typing import Any

from kserve import Model
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferRequest

from predictor.api.v2_codec import (
    INPUT_METADATA,
    OUTPUT_METADATA,
    binary_outputs_requested,
    decode_v2,
    encode_grpc,
)
from predictor.errors import NotReady
from predictor.serving import pipeline
from predictor.serving.limits import TextLimits
from predictor.serving.offload import INLINE_WORK_US, off_loop
from predictor.serving.service import TTSService


class TTSModel(Model):
    """The predictor as KServe's gRPC servicer sees it: ModelInfer lands in `predict`.

    REST v2 infer is served by our own route (server.py), which skips KServe's InferResponse
    conversion; KServe's only other REST infer path (with a model version) answers 501 before here.
    """

    def __init__(self, name: str, service: TTSService):
        self.service = service
        super().__init__(name)

    # KServe keeps readiness in an attribute it also writes; ours is the service's.
    @property
    def ready(self) -> bool:
        return self.service.ready

    @ready.setter
    def ready(self, _value: bool) -> None:
        pass

    def load(self) -> bool:
        # KServe calls load() on a request that finds the model not ready; loading is cold start's job.
        raise NotReady("model is not ready (cold start in progress)")

    def get_input_types(self) -> list[dict]:
        return INPUT_METADATA

    def get_output_types(self) -> list[dict]:
        return OUTPUT_METADATA

    def validate(self, payload: Any) -> Any:
        return payload

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> pb.ModelInferResponse:
        # Raw inputs get raw outputs (what Triton's client expects); typed inputs get typed contents.
        # Off the event loop: KServe hands us the message already read, so its size is not known here,
        # and normalizing or encoding a large one would hold the loop (and the probes) meanwhile.
        limits = TextLimits.of(self.service.settings)
        call = await off_loop(
            INLINE_WORK_US + 1, decode_v2, payload, binary_outputs_requested(payload), limits
        )
        result = await pipeline.synthesize(
            self.service, call.texts, call.params, call.ssml, self.service.settings, call.timestamps
        )
        size = sum(a.nbytes for a in result.audio)
        return await off_loop(size, encode_grpc, call, result, self.name)

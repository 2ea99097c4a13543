# syntax=docker/dockerfile:1
# tts-predictor image: no weights inside (they are fetched into an emptyDir at cold start).
#   CPU (default):  docker build -t tts-predictor .
#   GPU:            docker build -t tts-predictor:cuda \
#                     --build-arg RUNTIME_BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04 \
#                     --build-arg EXTRAS=native \
#                     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 \
#                     --build-arg ORT_PACKAGE=onnxruntime-gpu .
# The CPU image has no torch (ENGINE=onnx); EXTRAS=native adds the torch engine.
# Without a Docker engine or registry: `make image` (podman, a base from Debian packages; see docs/deployment.md).
ARG RUNTIME_BASE=python:3.11-slim-bookworm

FROM python:3.11-slim-bookworm AS build
ARG ORT_PACKAGE=onnxruntime
# Extras of the package to install: empty for the CPU image, "native" (torch) for the GPU one.
ARG EXTRAS=
# Where torch comes from when EXTRAS asks for it: torch's own index (its CPU wheels are ~200 MB where the
# default Linux wheel brings GBs of CUDA). Empty: no extra index, PyPI alone.
ARG TORCH_INDEX_URL=
WORKDIR /src
# Dependencies first, from pyproject.toml alone (an empty package stands in for the source), so that
# a source change rebuilds only our own small wheel, not the GB of dependency wheels.
COPY pyproject.toml README.md ./
RUN mkdir predictor && touch predictor/__init__.py \
    && pip wheel --no-cache-dir --wheel-dir /wheels/deps ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} \
      ".${EXTRAS:+[${EXTRAS}]}" "${ORT_PACKAGE}" \
    && rm -r /wheels/deps/tts_predictor-*.whl predictor build ./*.egg-info \
    # onnxruntime-gpu provides the same module as onnxruntime: keep only the one asked for.
    && if [ "${ORT_PACKAGE}" != onnxruntime ]; then rm /wheels/deps/onnxruntime-[0-9]*.whl; fi \
    && sha256sum /wheels/deps/*.whl > /wheels/deps.sha256
COPY predictor ./predictor
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels/app . \
    && sha256sum /wheels/app/*.whl > /wheels/app.sha256

FROM ${RUNTIME_BASE} AS runtime
# CUDA bases ship no Python; the slim Python base already has it. libsndfile comes with soundfile's wheel.
# hadolint ignore=DL3008
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# The wheels are bind-mounted, not copied: a COPY would leave them in a layer of the image (GBs), even
# when a later step deletes them. The checksum lists are copied so that a changed wheel invalidates
# the install layer in every builder's cache; they also record what the venv was built from.
COPY --from=build /wheels/deps.sha256 /opt/venv/wheels-deps.sha256
RUN --mount=type=bind,from=build,source=/wheels/deps,target=/wheels \
    python3.11 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index /wheels/*.whl
COPY --from=build /wheels/app.sha256 /opt/venv/wheels-app.sha256
RUN --mount=type=bind,from=build,source=/wheels/app,target=/wheels \
    /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /wheels/*.whl
# Non-root, and nothing written outside MODEL_DIR (an emptyDir), so the root filesystem can be read-only.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin predictor
USER 10001
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODEL_DIR=/mnt/models
EXPOSE 8080 8081
ENTRYPOINT ["tts-predictor", "serve"]

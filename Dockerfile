# syntax=docker/dockerfile:1
# tts-predictor image: no weights inside (they are fetched into an emptyDir at cold start).
#   CPU (default):  docker build -t tts-predictor .
#   GPU:            docker build -t tts-predictor:cuda \
#                     --build-arg RUNTIME_BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04 \
#                     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 \
#                     --build-arg ORT_PACKAGE=onnxruntime-gpu .
ARG RUNTIME_BASE=python:3.11-slim-bookworm

FROM python:3.11-slim-bookworm AS build
ARG ORT_PACKAGE=onnxruntime
# torch's own index: its CPU wheels are ~200 MB where the default Linux wheel brings GBs of CUDA.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY predictor ./predictor
# Wheels for the package and every dependency, so the runtime stage installs offline and holds no
# compiler, pip cache or source tree.
RUN pip wheel --no-cache-dir --wheel-dir /wheels --extra-index-url "${TORCH_INDEX_URL}" . "${ORT_PACKAGE}"

FROM ${RUNTIME_BASE} AS runtime
ARG ORT_PACKAGE=onnxruntime
# CUDA bases ship no Python; the slim Python base already has it. libsndfile comes with soundfile's wheel.
# hadolint ignore=DL3008
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /wheels /wheels
RUN python3.11 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels tts-predictor \
    # onnxruntime-gpu provides the same module as onnxruntime: swap, never install both.
    && if [ "${ORT_PACKAGE}" != onnxruntime ]; then \
         /opt/venv/bin/pip uninstall -y onnxruntime \
         && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels "${ORT_PACKAGE}"; \
       fi \
    && rm -rf /wheels
# Non-root, and nothing written outside MODEL_DIR (an emptyDir), so the root filesystem can be read-only.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin predictor
USER 10001
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODEL_DIR=/mnt/models
EXPOSE 8080 8081
ENTRYPOINT ["tts-predictor", "serve"]

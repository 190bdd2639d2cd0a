# The genjob image for every service of compose.yaml (api, worker, flower, migrate).
#
# torch goes in first, on its own layer, from the PyTorch CUDA index: the CUDA wheels bring the CUDA
# runtime with them, so the host only needs the NVIDIA driver and the NVIDIA Container Toolkit. Pick
# the build matching the host's driver with --build-arg TORCH_INDEX_URL=…/cu126 (or cpu for a CPU-only
# image). pyproject.toml's torch range (<2.14) accepts the pinned version, so `pip install` of the
# package keeps this torch instead of pulling another.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/cache/huggingface

RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# The caches compose mounts named volumes on: a fresh volume takes the owner of the image's directory.
RUN useradd --create-home --uid 1000 genjob \
    && mkdir -p /cache/huggingface /cache/genjob-costs \
    && chown genjob /cache/huggingface /cache/genjob-costs

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY genjob ./genjob
COPY worker ./worker
COPY api ./api
COPY generation ./generation
COPY migrations ./migrations
# A normal install, at the versions of constraints.txt: the migrations ship inside the package.
RUN pip install --constraint constraints.txt ".[worker,api]"

USER genjob
EXPOSE 8000 5555
CMD ["genjob", "--help"]

# One Dockerfile, two images (docs/guides/docker.md):
#   docker build -t nmt .                    the GPU image (the last stage, the default): CUDA runtime + PyPI's torch
#   docker build --target cpu -t nmt:cpu .   the CPU image: slim Debian/Python + PyTorch's CPU build, no CUDA libraries
# Data and outputs live in volumes (/app/data, /app/outputs), never in the image; the image runs as uid 1000.
#   docker run --gpus all -v $PWD/data:/app/data -v $PWD/outputs:/app/outputs nmt python train.py
#   docker run -i -v $PWD/outputs:/app/outputs nmt:cpu python translate.py checkpoint=outputs/RUN < in.de > out.en
#   docker run -p 8000:8000 -v $PWD/outputs:/app/outputs nmt:cpu python serve.py checkpoint=outputs/RUN host=0.0.0.0
# The bases are build arguments: scripts/docker_check.sh builds this same file on local Debian bases.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG CPU_BASE_IMAGE=python:3.11-slim-bookworm

# ---- CPU image: python3 (with venv) comes with the base; torch from PyTorch's CPU wheel index (~0.2 GB of
# wheels, against several GB for PyPI's Linux wheels, which are CUDA builds). TORCH_PIP_ARGS says where pip finds
# torch: a mirror of that index, or a folder of wheels (--find-links DIR).
FROM ${CPU_BASE_IMAGE} AS cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH MPLCONFIGDIR=/tmp/matplotlib NMT_IMAGE=cpu
# hadolint ignore=DL3013
RUN python3 -m venv /opt/venv \
    && pip install ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

# ---- the app: the same lines in both images (tests/test_docker.py checks that they stay the same)
WORKDIR /app
# Dependencies first, in a layer that survives code changes; torch is there already, so pip keeps it.
COPY pyproject.toml README.md ./
COPY nmt/__init__.py nmt/__init__.py
RUN pip install -e .
COPY . .
# The image's user is uid 1000; the code stays root's (read-only to it), the folders it writes are its own.
# (Ubuntu's images have a user with uid 1000 already: it makes way.)
RUN if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --create-home --uid 1000 --user-group nmt \
    && mkdir -p data outputs runs multirun && chown nmt:nmt /app data outputs runs multirun
USER 1000:1000
VOLUME ["/app/data", "/app/outputs"]
# serve.py's port (it binds 127.0.0.1 unless run with host=0.0.0.0, as inside a container it must be)
EXPOSE 8000
CMD ["python", "train.py", "--help"]
# ---- end of the app

# ---- GPU image: the torch==2.13.0 wheel from PyPI carries its own CUDA libraries; the host needs only the NVIDIA
# driver and the NVIDIA Container Toolkit. Without a GPU it trains on the CPU, and says so.
FROM ${BASE_IMAGE} AS gpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS=""
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH MPLCONFIGDIR=/tmp/matplotlib NMT_IMAGE=gpu
# hadolint ignore=DL3008,DL3013
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && pip install ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

# ---- the app: the same lines in both images (tests/test_docker.py checks that they stay the same)
WORKDIR /app
# Dependencies first, in a layer that survives code changes; torch is there already, so pip keeps it.
COPY pyproject.toml README.md ./
COPY nmt/__init__.py nmt/__init__.py
RUN pip install -e .
COPY . .
# The image's user is uid 1000; the code stays root's (read-only to it), the folders it writes are its own.
# (Ubuntu's images have a user with uid 1000 already: it makes way.)
RUN if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --create-home --uid 1000 --user-group nmt \
    && mkdir -p data outputs runs multirun && chown nmt:nmt /app data outputs runs multirun
USER 1000:1000
VOLUME ["/app/data", "/app/outputs"]
# serve.py's port (it binds 127.0.0.1 unless run with host=0.0.0.0, as inside a container it must be)
EXPOSE 8000
CMD ["python", "train.py", "--help"]
# ---- end of the app

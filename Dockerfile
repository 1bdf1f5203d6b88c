# GPU image: CUDA runtime + Python + this project.
#   docker build -t nmt .
#   docker run --gpus all -v $PWD/data:/app/data -v $PWD/outputs:/app/outputs nmt python train.py attention=additive
#   docker run --gpus all -v $PWD/outputs:/app/outputs -i nmt python translate.py checkpoint=outputs/RUN < in.de
#   docker run --gpus all -p 8000:8000 -v $PWD/outputs:/app/outputs nmt python serve.py checkpoint=outputs/RUN host=0.0.0.0
# The torch==2.13.0 wheel from PyPI carries its own CUDA libraries; the host needs only the NVIDIA driver
# and the NVIDIA Container Toolkit. Data and outputs live in volumes, never in the image.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first (a layer that survives code changes): the same two installs as `make install`.
COPY pyproject.toml README.md ./
COPY nmt/__init__.py nmt/__init__.py
RUN python3 -m venv /opt/venv \
    && pip install torch==2.13.0 \
    && pip install -e .
COPY . .

RUN useradd --create-home --uid 1000 nmt && mkdir -p data outputs && chown -R nmt /app
USER nmt
VOLUME ["/app/data", "/app/outputs"]
# serve.py's port (it binds 127.0.0.1 unless run with host=0.0.0.0, as inside this container it must be)
EXPOSE 8000
CMD ["python", "train.py"]

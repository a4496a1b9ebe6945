# The GPU record's environment: CUDA, a pinned PyTorch CUDA wheel, speedrun.
#
# The PyTorch wheel carries its own CUDA runtime, cuDNN, cuBLAS and NCCL, so
# the base image only has to be new enough for the wheel; a *devel* image is
# used because Triton (torch.compile, FlexAttention) compiles small C
# launchers at run time and needs gcc and the Python headers.
# Build args let you move both pins together, e.g.
#   --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04 \
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SPEEDRUN_HOME=/cache/speedrun

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04's Python is externally managed (PEP 668): use a virtual environment.
RUN python3 -m venv "$VIRTUAL_ENV" && pip install --upgrade pip

# PyTorch first, from its CUDA index, pinned; the package install below keeps it.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /opt/speedrun
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[hf,tensorboard]" \
 && python -c "import torch, speedrun; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# Data and caches live outside the image: mount them.
VOLUME ["/data", "/cache"]
WORKDIR /work
CMD ["speedrun", "info"]

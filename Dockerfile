# An image for one NVIDIA GPU (Linux, NVIDIA driver >= 580 on the host, the
# NVIDIA Container Toolkit to pass the GPU in), with the Atari suite:
#
#   docker build -t embodied:latest .
#   docker run --gpus all -v "$PWD/logdir:/logdir" embodied:latest \
#     python -m embodied.main --configs atari gpu --logdir /logdir/atari
#
# examples/kubernetes-indexed-job.yaml runs this image. The pip install line
# is README's GPU install line (tests/test_docs.py checks that they match).
FROM python:3.12-slim
WORKDIR /opt/embodied
COPY pyproject.toml README.md LICENSE ./
COPY embodied embodied
COPY configs configs
RUN pip install --no-cache-dir '.[cuda13,atari]'
CMD ["python", "-m", "embodied.main", "--help"]

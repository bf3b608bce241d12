# An image for one NVIDIA GPU (Linux, NVIDIA driver >= 580 on the host, the
# NVIDIA Container Toolkit to pass the GPU in), with the Atari suite:
#
#   docker build -t embodied:latest .
#   docker run --gpus all --shm-size 1g -v "$PWD/logdir:/logdir" -v "$HOME/.cache/embodied:/cache" embodied:latest python -m embodied.main --configs atari gpu --script parallel --logdir /logdir/atari_pong
#
# --shm-size gives the learner's shared-memory batches room (Docker's
# default /dev/shm is 64 MiB). JAX's compilation cache is /cache/jax
# (EMBODIED_JAX_CACHE): mount a host folder there so that the next
# container loads the compiled programs instead of compiling again. Rerun
# the same command to resume from the logdir.
#
# examples/kubernetes-indexed-job.yaml runs this image. The pip install line
# is README's GPU install line (tests/test_examples.py checks that they
# match).
FROM python:3.12-slim
WORKDIR /opt/embodied
COPY pyproject.toml README.md LICENSE ./
COPY embodied embodied
COPY configs configs
RUN pip install --no-cache-dir '.[cuda13,atari]'
ENV EMBODIED_JAX_CACHE=/cache/jax
CMD ["python", "-m", "embodied.main", "--help"]

#!/usr/bin/env bash
# Runs one experiment on the GPUs of this machine (all visible devices on the 'data' axis).
#   launch/local_gpu.sh configs/videocc_avr.py:demo workdirs/demo_gpu [--config.k=v ...]
# Run it from the repository root. `make venv ACCEL=cuda12` installs the pinned CUDA 12
# runtime into .venv (requirements-cuda12.txt; a no-op once there), and
# --require_backend=gpu stops the run at once if JAX still finds no GPU (driver,
# CUDA_VISIBLE_DEVICES) instead of training on the CPU.
set -euo pipefail
config=$1 workdir=$2; shift 2
make venv ACCEL=cuda12
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
exec .venv/bin/python -m avtext.main --require_backend=gpu --config="$config" \
  --workdir="$workdir" "$@"

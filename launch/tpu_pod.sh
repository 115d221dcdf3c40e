#!/usr/bin/env bash
# Runs one experiment on every host of a Cloud TPU VM pod slice.
#   launch/tpu_pod.sh TPU_NAME ZONE configs/videocc_avr.py gs://bucket/workdir [--config.k=v ...]
# Each host runs the same command; jax.distributed initializes from the TPU
# environment, every host feeds its slice of the global batch, and orbax
# writes one checkpoint to the (shared, e.g. GCS) workdir.
# Every host needs a checkout of the repository at ~/avtext, Python 3.11 and make
# (docs/scale.md "Run on a TPU pod"). Each host runs `make venv ACCEL=tpu` first (libtpu,
# pinned in requirements-tpu.txt; a no-op once installed), and --require_backend=tpu
# stops a host that finds no TPU at once instead of letting it train on its CPU.
# Check that the config fits its slice beforehand, on any machine:
#   python -m avtext.aot --config=configs/videocc_avr.py
set -euo pipefail
tpu=$1 zone=$2 config=$3 workdir=$4; shift 4
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "
  cd ~/avtext && make venv ACCEL=tpu && .venv/bin/python -m avtext.main --distributed \
  --require_backend=tpu --config=$config --workdir=$workdir $*"

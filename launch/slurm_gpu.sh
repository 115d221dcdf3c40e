#!/usr/bin/env bash
# Runs one experiment on a SLURM GPU cluster: one process per GPU, every GPU of
# every node on the 'data' mesh axis.
#   sbatch launch/slurm_gpu.sh configs/videocc_avr.py /shared/workdirs/avr [--config.k=v ...]
#   sbatch --nodes=4 --ntasks-per-node=4 launch/slurm_gpu.sh ...   # 4 nodes x 4 GPUs
# Submit from the repository root (the job runs there, with its .venv). The
# header below asks for 1 node with 8 GPUs; command-line options override it,
# and --ntasks-per-node must equal the GPUs wanted per node.
# - jax.distributed reads the coordinator (first node; port from the job id,
#   or $JAX_COORDINATOR_PORT), process count and rank from SLURM's variables.
# - --gpus-per-task=1 shows each process only its own GPU, as device 0, so
#   --local_device_ids=0 (JAX would otherwise pick device SLURM_LOCALID).
# - The workdir must be on a filesystem every node sees: orbax writes one
#   checkpoint from all processes, and re-submitting resumes from it.
# - config.train.batch_size is the global batch; each process feeds
#   batch_size / (number of processes) of it.
# - The job first runs `make venv ACCEL=cuda12` (the pinned CUDA 12 runtime of
#   requirements-cuda12.txt; a no-op once installed) in the shared checkout, and
#   every process passes --require_backend=gpu, so a node without a usable GPU
#   fails the job at once instead of training on its CPU.
#SBATCH --job-name=avtext
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
# SIGTERM to every task 2 min before the time limit: all stop at one step and save it
# (docs/scale.md "Preemption"); re-submitting resumes there.
#SBATCH --signal=TERM@120
#SBATCH --output=%x-%j.out
set -euo pipefail
config=$1 workdir=$2; shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
make venv ACCEL=cuda12
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
# srun no longer inherits --cpus-per-task from sbatch (SLURM >= 22.05).
srun --ntasks-per-node="$SLURM_NTASKS_PER_NODE" --gpus-per-task=1 \
  --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \
  .venv/bin/python -m avtext.main --distributed --local_device_ids=0 --require_backend=gpu \
  --config="$config" --workdir="$workdir" "$@"

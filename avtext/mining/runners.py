"""Where the mining pipeline runs: Beam's direct runner, or Beam's DaskRunner on a Dask
cluster, existing or started here (`python -m avtext.mine --runner=DaskRunner ...`).

  --dask_address=HOST:PORT  an existing `dask.distributed` scheduler (dask-jobqueue on
                            SLURM, dask-kubernetes, the Dask helm chart, `dask scheduler`
                            + `dask worker`): its workers need avtext installed and the
                            inputs and OUT on storage they all reach (docs/mining.md).
  --dask_local_workers=N    a `LocalCluster` of N worker processes (1 thread each) on this
                            machine, started for the run and closed after it.

Beam 2.77's own DaskRunner options (`--dask_client_address`, `--dask_npartitions`,
`--dask_partition_size`) pass through. Unless one of the last two is given,
`partition_args` sets the number of Dask partitions of every `beam.Create` (and so of
the stages after it) to max(4 per worker thread, larger input / 128): the runner's own
default puts up to 128 elements in a partition, so a small corpus would run on one
worker, while a partition's outputs stay in its worker's memory until it ends (Dask
bags are not streamed) and each partition adds tasks to every shuffle (a GroupByKey).
Measured (BENCHMARKS.md): partitions of <= 16 elements made 1000 videos 3x slower on
Dask than on the direct runner.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Sequence


def _flag(args: Sequence[str], name: str) -> str | None:
  """The value of --name=V or --name V in args (the last one given), else None."""
  value = None
  for k, a in enumerate(args):
    if a == f'--{name}' and k + 1 < len(args):
      value = args[k + 1]
    elif a.startswith(f'--{name}='):
      value = a.split('=', 1)[1]
  return value


DASK_RUNNER = 'apache_beam.runners.dask.dask_runner.DaskRunner'  # not in Beam's short names


def is_dask(beam_args: Sequence[str]) -> bool:
  return _flag(beam_args, 'runner') in ('DaskRunner', DASK_RUNNER)


def connect(address: str, timeout_s: float = 10.0):
  """A `distributed.Client` on the scheduler at address, or one clear error."""
  import distributed  # pylint: disable=g-import-not-at-top
  try:
    return distributed.Client(address, timeout=timeout_s)
  except (OSError, TimeoutError) as e:
    raise ValueError(f'--dask_address {address}: no Dask scheduler answers there within '
                     f'{timeout_s:.0f} s ({type(e).__name__}: {e}); start one (`dask '
                     'scheduler`) or pass --dask_local_workers=N') from e


@contextlib.contextmanager
def beam_args_for(beam_args: Sequence[str], *, dask_address: str | None = None,
                  dask_local_workers: int | None = None) -> Iterator[list[str]]:
  """The Beam options that run the pipeline where the flags say (module docstring),
  with the Dask cluster, when one is started here, up for the duration."""
  beam_args = list(beam_args)
  dask = is_dask(beam_args)
  if not dask:
    if dask_address or dask_local_workers:
      raise ValueError('--dask_address / --dask_local_workers need --runner=DaskRunner')
    yield beam_args
    return
  beam_args = [a for a in beam_args if not a.startswith('--runner')] + [f'--runner={DASK_RUNNER}']
  given = _flag(beam_args, 'dask_client_address')
  if sum(x is not None for x in (dask_address, dask_local_workers, given)) != 1:
    raise ValueError('--runner=DaskRunner needs exactly one of --dask_address=HOST:PORT '
                     '(an existing Dask cluster) and --dask_local_workers=N (a local one)')
  if dask_local_workers is not None and dask_local_workers < 1:
    raise ValueError(f'--dask_local_workers must be >= 1, got {dask_local_workers}')
  with contextlib.ExitStack() as stack:
    if dask_local_workers:
      import distributed  # pylint: disable=g-import-not-at-top
      cluster = stack.enter_context(distributed.LocalCluster(
          n_workers=dask_local_workers, threads_per_worker=1, processes=True,
          dashboard_address=None))
      address = cluster.scheduler_address
    else:
      address = dask_address or given
    client = stack.enter_context(connect(address))
    threads = sum(client.nthreads().values())
    if not threads:
      raise ValueError(f'--dask_address {address}: the scheduler has no workers')
    logging.info('mining: Dask cluster %s, %d workers, %d threads', address,
                 len(client.nthreads()), threads)
    if given is None:
      beam_args.append(f'--dask_client_address={address}')
    yield beam_args


def partition_args(beam_args: Sequence[str], largest_input: int) -> list[str]:
  """beam_args plus the number of Dask partitions for inputs of at most largest_input
  elements (module docstring), unless they name one or do not run on Dask."""
  beam_args = list(beam_args)
  if not is_dask(beam_args) or _flag(beam_args, 'dask_npartitions') is not None or \
      _flag(beam_args, 'dask_partition_size') is not None:
    return beam_args
  with connect(_flag(beam_args, 'dask_client_address')) as client:
    threads = sum(client.nthreads().values())
  partitions = max(4 * max(1, threads), -(-largest_input // 128))
  return beam_args + [f'--dask_npartitions={partitions}']


def run(pipeline) -> None:
  """Run a Beam pipeline to the end; close the Dask client the DaskRunner opened."""
  result = pipeline.run()
  try:
    result.wait_until_finish()
  finally:
    client = getattr(result, 'client', None)  # DaskRunnerResult's, never closed by Beam
    if client is not None:
      client.close()

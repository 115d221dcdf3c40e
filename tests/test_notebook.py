"""notebooks/inspect_run.ipynb runs top to bottom on a tiny run (nbclient, python3 kernel)."""
import os
import pathlib
import re
import shutil
import sys
import uuid

import nbclient
import nbformat
import pytest

from tests.test_train_trainer import REPO
from tests.test_train_trainer import make_trainer
from tests.test_train_trainer import tiny_config


def _text(cell) -> str:
  return ''.join(o.get('text', '') for o in cell.get('outputs', ()) if o.output_type == 'stream')


def _execute(run_dir: str, kernel_dir) -> str:
  """The notebook run on `run_dir` (as AVTEXT_RUN_DIR) by a python3 kernel started in
  `kernel_dir`; the text of every code cell's output."""
  nb = nbformat.read(REPO / 'notebooks' / 'inspect_run.ipynb', as_version=4)
  assert not any(c.get('outputs') for c in nb.cells if c.cell_type == 'code'), \
      'commit the notebook without outputs'
  nb.cells.append(nbformat.v4.new_code_cell('import sys; print("kernel:", sys.executable)'))
  env = {'AVTEXT_RUN_DIR': run_dir, 'AVTEXT_NUM_CLIPS': '8',
         'MPLBACKEND': 'Agg', 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '',
         'PYTHONPATH': str(REPO)}
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    # ipykernel's python3 kernelspec runs sys.executable: this venv's interpreter.
    nbclient.NotebookClient(nb, timeout=300, kernel_name='python3',
                            resources={'metadata': {'path': str(kernel_dir)}}).execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  out = '\n'.join(_text(c) for c in nb.cells if c.cell_type == 'code')
  assert f'kernel: {sys.executable}' in out  # this venv's interpreter, not another python3
  return out


@pytest.fixture
def run_in_repo():
  """A run directory under the repository's workdirs/ (gitignored), given to the notebook
  by its path relative to the repository root, as README's `workdirs/demo/avr` is."""
  relative = pathlib.Path('workdirs') / f'_test_notebook_{uuid.uuid4().hex[:8]}'
  try:
    yield relative
  finally:
    shutil.rmtree(REPO / relative, ignore_errors=True)


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_inspect_run_notebook_from_notebooks_dir_on_a_tiny_run(run_in_repo):
  """As README says to open it: Jupyter starts the kernel in notebooks/, and the run
  path is relative to the repository root."""
  # One device: the 8-device step compiles ~15 s longer on 2 cores, and the kernel has one.
  config = tiny_config(**{'num_devices': 1, 'train.num_steps': 2, 'train.log_every_steps': 1,
                          'evals.test.every_steps': 1})
  make_trainer(config, REPO / run_in_repo).train()
  out = _execute(str(run_in_repo), REPO / 'notebooks')
  assert f"run: {REPO / run_in_repo}  step: 2" in out
  assert f'task: avr  model: {config.model.name}' in out and "parameters per module: {'text'" in out
  assert "evaluator 'test': 8 clips" in out and 'similarity matrix: (8, 8)' in out
  assert all(f'  {rank}. video ' in out for rank in (1, 2, 3))  # the top 3 of one caption
  # The curves cell found the trainer's scalars: the loss and the evaluator's R@1 (two
  # evaluations: a curve); the numbers it prints are rounded.
  scalars = next(line for line in out.splitlines() if line.startswith('scalars:'))
  assert "'loss'" in scalars and "'test/t2v_R@1'" in scalars
  results = next(line for line in out.splitlines() if line.startswith('results:'))
  assert all(len(v.split('.')[-1]) <= 2 for v in re.findall(r'\d+\.\d+', results)), results
  # The R@1 it prints on 8 clips is the einsum of the embeddings it made: a number in
  # [0, 100] in steps of 12.5.
  r1 = float(out.split('R@1 on these 8: ')[1].split(' %')[0])
  assert r1 in {12.5 * k for k in range(9)}


@pytest.mark.slow  # a second tiny training run and kernel (~20 s)
def test_inspect_run_notebook_says_what_applies_to_a_classification_run(tmp_path):
  sys.path.insert(0, str(REPO))
  try:
    from configs import synthetic_video_pretrain  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(REPO))
  config = synthetic_video_pretrain.get_config('tiny')
  config.num_devices = 1
  config.train.num_steps = 2
  make_trainer(config, tmp_path / 'run').train()
  out = _execute(str(tmp_path / 'run'), tmp_path)
  assert "task: video_cls" in out
  assert "task 'video_cls': a classification run" in out
  assert out.count('skipped: not a retrieval run') == 2
  assert 'Traceback' not in out and 'StopIteration' not in out

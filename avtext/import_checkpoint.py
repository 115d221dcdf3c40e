r"""Official checkpoint -> avtext run directory.

    python -m avtext.import_checkpoint --system=coot|xml|mmt \
        --checkpoint=FILE --out=RUNDIR [--config=configs/<x>.py[:variant]] [--config.k=v]

FILE: the official code's PyTorch checkpoint (needs torch: pip install -e .[convert]) or
the same state dict as .npz (`avtext.weights.official`). --config defaults to the
system's paper config; the official hyper-parameters stored in the checkpoint (hidden
size, heads, lengths, ...) are written onto config.model, and a conflict with a field
you set on the command line stops the import naming it. Every official tensor is used
exactly once and every avtext parameter set exactly once, or the import stops naming
the tensors. RUNDIR then holds config.json, checkpoint step 0 (fresh optimizer state) and import.json:

    python -m avtext.main --config=configs/<x>.py --workdir=RUNDIR --mode=eval
    avtext.runs.load_run("RUNDIR")
    --config.init_from.workdir=RUNDIR   (fine-tune from it)

Per system (the converters' docstrings list the tensor mapping):
  xml   jayleicn/TVRetrieval  crossmodal_moment_localization train.py checkpoint
  coot  gingsi/coot-videotext the nntrainer models file (net_video_local / _global,
                              net_text_local / _global)
  mmt   jayleicn/TVCaption    multimodal_transformer train.py checkpoint (+ its vocab)

Library: `import_checkpoint(system, checkpoint, out, config=None)` does all of it;
`avtext.weights.official` reads checkpoints and checks the mapping, the converters
`avtext.weights.official_<system>` map the tensors.
"""
import importlib
import pathlib
import sys
import tempfile
import zlib
from typing import Any

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from avtext import cli
from avtext import errors
from avtext import runs
from avtext.tasks import task_registry as tasks
from avtext.train import checkpointing
from avtext.train import control as control_lib
from avtext.train import optimizers
from avtext.train import rundir
from avtext.train import trainer as trainer_lib
from avtext.weights import official


def abstract_run(config, workdir: pathlib.Path):
  """(Trainer, abstract TrainState) for `config`: shapes only, no data opened."""
  task = tasks.build_task(config)
  # No evaluators are built (they may open data); a stand-in answers config.eval.select.
  select = control_lib.selection(config)
  stand_ins = {select[0].split("/")[0]: None} if select else {}
  run = trainer_lib.Trainer(config, workdir, task, evaluators=stand_ins)
  batch = task.batch_spec(int(config.train.batch_size), train=True)
  state, tx, _ = run.abstract_state(batch)
  return run, state, tx


def write_run(out: str | pathlib.Path, config, variables: dict, *,
              checkpoint: official.Checkpoint, system: str) -> pathlib.Path:
  """Writes run directory `out`: config.json, checkpoint step 0 (the imported variables,
  a fresh optimizer state) and import.json (where the weights came from)."""
  out = pathlib.Path(out).absolute()
  if (out / checkpointing.LATEST_DIR).exists() or (out / rundir.CONFIG_FILE).exists():
    raise FileExistsError(f"--out={out}: already holds a run; pass a new directory")
  out.mkdir(parents=True, exist_ok=True)
  with rundir.lock(out):
    run, abstract, tx = abstract_run(config, out)
    variables = dict(variables)
    params = variables.pop("params")
    frozen = optimizers.frozen_mask(params, tuple(config.optimizer.get("frozen") or ()))
    opt_state = jax.jit(tx.init)(optimizers.split_frozen(params, frozen)[0])
    state = trainer_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        model_state={k: variables[k] for k in abstract.model_state},
        opt_state=opt_state, rng=jax.random.PRNGKey(int(config.seed)),
        control=control_lib.init(config))
    del run
    ckpt = checkpointing.Checkpointer(out / checkpointing.LATEST_DIR, async_save=False)
    try:
      ckpt.save(0, state, {})
      ckpt.wait()
    finally:
      ckpt.close()
    trainer_lib._write_config(config, out)  # pylint: disable=protected-access
    crc = 0
    with checkpoint.path.open("rb") as f:
      while chunk := f.read(1 << 20):
        crc = zlib.crc32(chunk, crc)
    rundir.write_json(out / official.IMPORT_FILE, {
        "system": system, "checkpoint": str(checkpoint.path.absolute()),
        "checkpoint_crc32": crc, "tensors": len(checkpoint.tensors),
        "meta": _jsonable(checkpoint.meta)})
  return out


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return x.tolist() if x.size <= 16 else f"array{list(x.shape)}"
  if isinstance(x, (str, int, float, bool)) or x is None:
    return x
  if isinstance(x, np.generic):
    return x.item()
  return repr(x)


def import_variables(checkpoint: official.Checkpoint, config, converter) -> dict:
  """The model's variables from `checkpoint` through `converter.convert` (all checked)."""
  with tempfile.TemporaryDirectory() as tmp:
    _, abstract, _ = abstract_run(config, pathlib.Path(tmp))
  template = {"params": abstract.params, **abstract.model_state}
  porter = official.Porter(checkpoint, template)
  converter.convert(checkpoint, porter, config)
  return porter.finish()


SYSTEMS = ("coot", "xml", "mmt")


def converter(system: str):
  """The converter module of `system` (avtext/weights/official_<system>.py)."""
  if system not in SYSTEMS:
    raise ValueError(f"--system={system!r}; expected one of {SYSTEMS}")
  return importlib.import_module(f"avtext.weights.official_{system}")


def import_checkpoint(system: str, checkpoint_path: str | pathlib.Path,
                      out: str | pathlib.Path, config=None) -> pathlib.Path:
  """Official checkpoint -> run directory `out` (module docstring):
  reads it, maps the official hyper-parameters onto `config` (default: the system's
  paper config), converts every tensor (all checked) and writes the run; returns it."""
  conv = converter(system)
  if config is None:
    default = pathlib.Path(conv.DEFAULT_CONFIG)
    if not default.exists():  # run from elsewhere than the repository root
      default = pathlib.Path(__file__).resolve().parents[1] / default
    config = runs.config_file(str(default))
  checkpoint = official.read_checkpoint(checkpoint_path)
  config = conv.configure(config, checkpoint)
  variables = import_variables(checkpoint, config, conv)
  return write_run(out, config, variables, checkpoint=checkpoint, system=system)


FLAGS = flags.FlagValues()
_SYSTEM = flags.DEFINE_enum("system", None, list(SYSTEMS), "which official code wrote the "
                            "checkpoint", flag_values=FLAGS)
_CHECKPOINT = cli.DEFINE_path("checkpoint", None, "the official checkpoint file (PyTorch, "
                              "or the same state dict as .npz)", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the run directory to write (must not hold a run)",
                       flag_values=FLAGS)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<x>.py[:variant] (default: the system's paper config); "
    "--config.<field>=<value> overrides", lock_config=False, flag_values=FLAGS)
flags.mark_flags_as_required(["system", "checkpoint", "out"], flag_values=FLAGS)


def main(argv) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  try:
    run = import_checkpoint(_SYSTEM.value, _CHECKPOINT.value, _OUT.value, config)
  except (ValueError, ImportError) as e:  # the converters' messages name the tensor / file
    raise errors.BadInput(str(e)) from None
  logging.info("imported the official %s checkpoint %s into %s", _SYSTEM.value,
               _CHECKPOINT.value, run)
  print(run)


if __name__ == "__main__":
  cli.run(main, FLAGS)

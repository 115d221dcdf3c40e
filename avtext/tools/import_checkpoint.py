r"""Official checkpoint -> avtext run directory.

    python -m avtext.tools.import_checkpoint --system=coot|xml|mmt \
        --checkpoint=FILE --out=RUNDIR [--config=configs/<x>.py[:variant]] [--config.k=v]

FILE: the official code's PyTorch checkpoint (needs torch: pip install -e .[convert]) or
the same state dict as .npz (`avtext.weights.official`). --config defaults to the
system's paper config; the official hyper-parameters stored in the checkpoint (hidden
size, heads, lengths, ...) are written onto config.model, and a conflict with a field
you set on the command line stops the import naming it. Every official tensor is used
exactly once and every avtext parameter set exactly once, or the import stops naming
the tensors. RUNDIR then holds config.json, checkpoint step 0 and import.json:

    python -m avtext.main --config=configs/<x>.py --workdir=RUNDIR --mode=eval
    avtext.inspect.load_run("RUNDIR")
    --config.init_from.workdir=RUNDIR   (fine-tune from it)

Per system (the converters' docstrings list the tensor mapping):
  xml   jayleicn/TVRetrieval  crossmodal_moment_localization train.py checkpoint
  coot  gingsi/coot-videotext models saved by the nntrainer (video + text networks)
  mmt   jayleicn/TVCaption    multimodal_transformer train.py checkpoint (+ its vocab)
"""
import importlib
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

SYSTEMS = ("coot", "xml", "mmt")

_SYSTEM = flags.DEFINE_enum("system", None, list(SYSTEMS), "which official code wrote it")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "the official checkpoint file")
_OUT = flags.DEFINE_string("out", None, "the run directory to write (must not hold a run)")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<x>.py[:variant] (default: the system's paper config)",
    lock_config=False)
flags.mark_flags_as_required(["system", "checkpoint", "out"])


def converter(system: str):
  if system not in SYSTEMS:
    raise ValueError(f"--system={system!r}; expected one of {SYSTEMS}")
  return importlib.import_module(f"avtext.weights.official_{system}")


def import_checkpoint(system: str, checkpoint_path: str, out: str, config=None):
  """Reads, converts and writes (module docstring); returns the run directory."""
  from avtext.weights import official  # pylint: disable=g-import-not-at-top
  conv = converter(system)
  if config is None:
    from avtext import inspect  # pylint: disable=g-import-not-at-top
    import pathlib  # pylint: disable=g-import-not-at-top
    default = pathlib.Path(conv.DEFAULT_CONFIG)
    if not default.exists():  # run from elsewhere than the repository root
      default = pathlib.Path(__file__).resolve().parents[2] / default
    config = inspect.config_file(str(default))
  checkpoint = official.read_checkpoint(checkpoint_path)
  config = conv.configure(config, checkpoint)
  variables = official.import_variables(checkpoint, config, conv)
  run = official.write_run(out, config, variables, checkpoint=checkpoint, system=system)
  logging.info("imported %d official tensors from %s into %s", len(checkpoint.tensors),
               checkpoint.path, run)
  return run


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    run = import_checkpoint(_SYSTEM.value, _CHECKPOINT.value, _OUT.value, _CONFIG.value)
  except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
    print(f"import_checkpoint: {e}", file=sys.stderr)
    return 1
  print(run)
  return 0


if __name__ == "__main__":
  app.run(main)

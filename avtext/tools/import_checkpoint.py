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
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from avtext.weights import official

_SYSTEM = flags.DEFINE_enum("system", None, list(official.SYSTEMS),
                            "which official code wrote it")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "the official checkpoint file")
_OUT = flags.DEFINE_string("out", None, "the run directory to write (must not hold a run)")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<x>.py[:variant] (default: the system's paper config)",
    lock_config=False)
flags.mark_flags_as_required(["system", "checkpoint", "out"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    run = official.import_checkpoint(_SYSTEM.value, _CHECKPOINT.value, _OUT.value,
                                     _CONFIG.value)
  except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
    print(f"import_checkpoint: {e}", file=sys.stderr)
    return 1
  logging.info("imported the official %s checkpoint %s into %s", _SYSTEM.value,
               _CHECKPOINT.value, run)
  print(run)
  return 0


if __name__ == "__main__":
  app.run(main)

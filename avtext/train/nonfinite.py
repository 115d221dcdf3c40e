"""A run that blew up: the error the trainer stops with, and advice that fits its config.

The trainer checks every step's loss on the host (one step late) and the parameters'
global norm before it evaluates or saves them (`Trainer._check_finite`); the first
non-finite value stops training with the last finite checkpoint kept. `avtext.cli.run`
prints the one line (errors.RunStopped) and exits 1.
"""
import ml_collections

from avtext import errors


class NonFiniteError(errors.RunStopped, FloatingPointError):
  """A training loss, or the parameters about to be evaluated or saved, are not finite."""


def advice(config: ml_collections.ConfigDict, step: int) -> str:
  """What to change, from what `config` already does, for a run whose loss (or parameters)
  first went non-finite at `step` (1: the loss of the weights it started from)."""
  if step == 1:
    source = (f" or the weights of config.init_from ({config.init_from.workdir})"
              if (config.get("init_from") or {}).get("workdir") else "")
    return ("The first step's loss comes from the weights before any update: look for NaN "
            f"or inf in the training inputs (features, audio){source}.")
  opt = config.optimizer
  lr = float(opt.learning_rate)
  fixes = [f"lower the learning rate (--config.optimizer.learning_rate={lr / 10:g}, a tenth "
           f"of {lr:g})"]
  if not opt.get("grad_clip_norm"):
    fixes.append("clip the gradients (--config.optimizer.grad_clip_norm=1.0; none now)")
  if not (opt.get("warmup_steps") or opt.get("warmup_epochs")):
    fixes.append("warm the rate up (--config.optimizer.warmup_steps=N; none now)")
  if str((config.get("model") or {}).get("dtype", "")) == "float16":
    fixes.append("compute in bfloat16 (--config.model.dtype=bfloat16; float16 overflows "
                 "above 65504)")
  text = ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1]
  return text[0].upper() + text[1:] + "."

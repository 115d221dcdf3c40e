"""What the experiment configs share: variant parsing, the tiny schedule, the
accelerator fields (paper / synthetic scale) and the `config.eval` block.

Configs import it as a package module (`from configs import common`): the repository
root is on the path when `python -m avtext.main --config=configs/<x>.py` runs from it,
and the install (setup.py) lists the `configs` package for any other working directory.
"""
import ml_collections


def parse_variants(arg: str | None, known, config_file: str) -> set[str]:
  """The comma-separated variants of `arg` (`--config=<file>:a,b`), checked against
  `known`; every config of configs/ reads its variants through this."""
  variants = set(filter(None, (arg or "").split(",")))
  unknown = variants - set(known)
  if unknown:
    raise ValueError(f"{config_file}: unknown variant(s) {sorted(unknown)}; expected a "
                     f"comma-separated subset of {list(known)}")
  return variants


def tiny_schedule(config: ml_collections.ConfigDict, *, num_steps: int, every_steps: int,
                  warmup_steps: int, batch_size: int = 8) -> None:
  """The tiny variants' schedule: `num_steps` steps of `batch_size`, logs, checkpoints and
  the val evaluator every `every_steps`, step-based warmup."""
  config.train.batch_size = batch_size
  config.train.num_epochs = None
  config.train.num_steps = num_steps
  config.train.log_every_steps = every_steps
  config.train.checkpoint_every_steps = every_steps
  config.optimizer.warmup_epochs = None
  config.optimizer.warmup_steps = warmup_steps
  if "val" in config.get("evals", {}):
    config.evals.val.every_epochs = None
    config.evals.val.every_steps = every_steps
  config.eval.batch_size = batch_size


def paper_scale(config: ml_collections.ConfigDict, topology: str | None, *,
                dtype: str = "bfloat16", remat: str = "none", attention: str = "xla",
                fsdp: bool = False, scan_layers: bool = False) -> None:
  """The accelerator fields every config has (docs/scale.md "Paper scale"): the TPU slice the
  paper setup is sized for (`python -m avtext.aot` proves the fit), compute dtype,
  remat, attention, scanned layers and FSDP. Synthetic variants call it with topology None and the
  float32 defaults, so their numbers stay as they were."""
  # A placeholder, not None, so --config.target_topology=v5e:2x2 can still set it.
  config.target_topology = topology or ml_collections.config_dict.placeholder(str)
  config.model.dtype, config.model.remat, config.model.attention = dtype, remat, attention
  config.model.scan_layers = scan_layers
  # The platform the model is traced for (cpu | gpu | tpu: avtext.ops' CPU-only rewrites,
  # "auto" attention's kernel); unset: JAX's default backend, written into config.json.
  config.model.backend = ml_collections.config_dict.placeholder(str)
  # fsdp_min_size unset: avtext.train.partitioning.FSDP_MIN_SIZE.
  config.partitioning = ml_collections.ConfigDict(dict(
      rules=(), fsdp=fsdp, fsdp_min_size=ml_collections.config_dict.placeholder(int)))
  config.train.microbatches = config.train.get("microbatches") or 1


def synthetic_scale(config: ml_collections.ConfigDict) -> None:
  """Demo / tiny: CPU-sized, float32, no remat, materialized attention, no FSDP."""
  paper_scale(config, None, dtype="float32")


def with_synthetic(config: ml_collections.ConfigDict, variants: set[str],
                   synthetic) -> ml_collections.ConfigDict:
  """`config`, or its demo / tiny variant: the synthetic world's scale (`synthetic_scale`)
  and then the config's own `synthetic(config, tiny=...)` (data paths, widths, schedule)."""
  if variants & {"demo", "tiny"}:
    synthetic_scale(config)
    synthetic(config, tiny="tiny" in variants)
  return config


def eval_config(batch_size: int) -> ml_collections.ConfigDict:
  """`config.eval`: batch size, model selection, plateau and early stopping (all off).

  See avtext/train/control.py: select = ("<evaluator>/<metric>", "max"|"min")
  keeps the best `keep_best` checkpoints; plateau.factor (e.g. COOT's 0.1)
  turns reduce-on-plateau on; early_stopping_patience (e.g. XML's 10) turns
  early stopping on.
  """
  return ml_collections.ConfigDict(dict(
      batch_size=batch_size,
      select=ml_collections.config_dict.placeholder(tuple),
      keep_best=1,
      plateau=dict(factor=ml_collections.config_dict.placeholder(float), patience=2,
                   cooldown=3, min_lr=0.0, threshold=1e-4),
      early_stopping_patience=ml_collections.config_dict.placeholder(int)))

r"""The official PyTorch code of COOT, XML and MMT, loaded from a checkout: models built as
the official training scripts build them, their checkpoints saved as those scripts save
them and imported with `avtext.import_checkpoint`, and the parity table.

Shared by the train-step benchmarks beside the official code (benchmarks/speed/
coot_train_step.py, xml_train_step.py) and the parity tests (tests/test_parity_*.py, `make
test-parity`). Nothing of the official code is vendored: it is imported from the checkout
at run time (`checkout(name)`), in the bench venv (`make bench-venv`: torch CPU, easydict):

    git -C <mirror of jayleicn/TVRetrieval> archive HEAD baselines utils \
        | tar -x -C $OFFICIAL/TVRetrieval
    git -C <mirror of jayleicn/TVCaption> archive HEAD baselines utils \
        | tar -x -C $OFFICIAL/TVCaption
    git -C <mirror of gingsi/coot-videotext> archive HEAD coot nntrainer config repo_config.py \
        | tar -x -C $OFFICIAL/coot-videotext
"""
import collections
import collections.abc
import datetime
import os
import pathlib
import platform
import tempfile
import types

import numpy as np

from benchmarks import common

TOLERANCE = 1e-4
# The checkouts under $AVTEXT_OFFICIAL (default workdirs/official): {name: (repository,
# a file it must hold)}.
CHECKOUTS = {
    "TVRetrieval": ("jayleicn/TVRetrieval",
                    "baselines/crossmodal_moment_localization/model_xml.py"),
    "TVCaption": ("jayleicn/TVCaption", "baselines/multimodal_transformer/transformer/model.py"),
    "coot-videotext": ("gingsi/coot-videotext", "coot/model_retrieval.py"),
}
OFFICIAL_ENV = "AVTEXT_OFFICIAL"


def checkout(name: str) -> pathlib.Path | None:
  """$AVTEXT_OFFICIAL/<name> (default workdirs/official/<name>) if it holds the official
  code, else None."""
  root = pathlib.Path(os.environ.get(OFFICIAL_ENV) or common.REPO / "workdirs" / "official")
  path = root.expanduser() / name
  return path if (path / CHECKOUTS[name][1]).is_file() else None


def require(path: pathlib.Path, name: str) -> pathlib.Path:
  """`path` if it is a checkout of `name`, else SystemExit naming what to pass."""
  repo, marker = CHECKOUTS[name]
  if not (pathlib.Path(path) / marker).is_file():
    raise SystemExit(f"{path}: no {marker}; pass a checkout of {repo} (see "
                     "benchmarks/common/official.py)")
  return pathlib.Path(path)


# ---------------------------------------------------------------- parity table

def max_abs_diff(ours, theirs) -> float:
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  if ours.shape != theirs.shape:
    raise ValueError(f"shapes differ: avtext {ours.shape}, official {theirs.shape}")
  return float(np.max(np.abs(ours - theirs))) if ours.size else 0.0


def parity_table(system: str, rows: list[tuple], extra: list[str]) -> list[str]:
  """rows: (intermediate, max |diff|, shape[, tolerance]): the row's own tolerance where a
  fourth element gives one (the check says why), else TOLERANCE. Prints the markdown
  table; returns the rows outside their tolerance."""
  print(f"\n## {system}: avtext vs official, {datetime.date.today()}, {platform.node()}, "
        f"float32, tolerance {TOLERANCE:g}\n")
  print("| intermediate | shape | max abs diff | |\n|---|---|---|---|")
  failed = []
  for name, diff, shape, *own in rows:
    tolerance = own[0] if own else TOLERANCE
    verdict = "ok" if diff <= tolerance else "FAIL"
    if diff > tolerance:
      failed.append(f"{name}: {diff:.2e} > {tolerance:.2g}")
    if own:
      verdict += f" (tolerance {tolerance:.2g})"
    print(f"| {name} | {shape} | {diff:.2e} | {verdict} |")
  for line in extra:
    print(line)
  print(f"\n{'NOT ALL WITHIN' if failed else 'ALL WITHIN'} {TOLERANCE:g}", flush=True)
  return failed


def parity_test(name: str, system: str, run) -> None:
  """A parity test's body: skips, saying why, without torch or the checkout `name`; else
  `run(checkout)` -> (rows, extra), prints the table and fails on a row outside its
  tolerance."""
  import pytest  # pylint: disable=g-import-not-at-top
  pytest.importorskip("torch", reason="needs torch: the bench venv (`make bench-venv`), as "
                      "`make test-parity` runs it")
  repo = checkout(name) or pytest.skip(
      f"needs a checkout of {CHECKOUTS[name][0]} at ${OFFICIAL_ENV}/{name} (default "
      "workdirs/official; benchmarks/common/official.py)")
  rows, extra = run(repo.absolute())
  failed = parity_table(system, rows, extra)
  assert not failed, failed


# ---------------------------------------------------------------- COOT (gingsi/coot-videotext)

COOT_YAML = "config/retrieval/paper2020/anet_coot.yaml"


def coot(official_dir: pathlib.Path):
  """The official COOT modules, imported from the checkout `official_dir`. Python >= 3.10
  removed the `collections.Mapping`-style aliases nntrainer imports; they are restored from
  `collections.abc` first. Nothing else is patched."""
  for name in ("Mapping", "MutableMapping", "Iterable", "Sequence", "Callable"):
    if not hasattr(collections, name):
      setattr(collections, name, getattr(collections.abc, name))
  common.import_checkout(official_dir)
  # pylint: disable=g-import-not-at-top
  import torch
  from coot import configs_retrieval
  from coot import dataset_retrieval
  from coot import loss_fn
  from coot import model_retrieval
  from coot import trainer_retrieval
  from nntrainer import optimization
  from nntrainer import utils_yaml
  return types.SimpleNamespace(torch=torch, configs=configs_retrieval, data=dataset_retrieval,
                               loss=loss_fn, model=model_retrieval, trainer=trainer_retrieval,
                               optimization=optimization, yaml=utils_yaml)


def coot_manager(off, official_dir: pathlib.Path, seed: int = 0):
  """(cfg, RetrievalModelManager) of anet_coot.yaml, float32 on the CPU, its init drawn
  after torch.manual_seed(seed)."""
  off.torch.manual_seed(seed)
  config = off.yaml.load_yaml_config_file(str(official_dir / COOT_YAML))
  config.update(use_cuda=False, fp16_train=False, fp16_val=False, cudnn_enabled=False,
                cudnn_benchmark=False)
  cfg = off.configs.RetrievalConfig(config)
  return cfg, off.model.RetrievalModelManager(cfg)


def coot_stand_in_trainer(off, cfg, num_samples: int = 1):
  """trainer_retrieval.RetrievalTrainer's loss methods (compute_total_constrastive_loss,
  compute_cyclecons_loss and what they call) bound to a stand-in holding what they read.
  num_samples: the CMC's clips per video (the trainer's 1, drawn at random; -1: all)."""
  stand_in = types.SimpleNamespace(cfg=cfg)
  stand_in.loss_contr = off.loss.ContrastiveLoss(cfg.train.contrastive_loss_config.margin,
                                                 use_cuda=False)
  stand_in.loss_cycle_cons = off.loss.CycleConsistencyLoss(num_samples=num_samples,
                                                           use_cuda=False)
  trainer_cls = off.trainer.RetrievalTrainer
  for method in ("compute_align_loss", "compute_cluster_loss",
                 "compute_total_constrastive_loss", "compute_cyclecons_loss"):
    setattr(stand_in, method, types.MethodType(getattr(trainer_cls, method), stand_in))
  return stand_in


def coot_import(off, mgr):
  """`mgr`'s weights saved as nntrainer's `_save_checkpoint` saves them
  (th.save(model_mgr.get_model_state(), "model_0.pth")), imported with
  `import_checkpoint("coot", ...)` onto the default config (configs/coot_activitynet.py)
  and opened with `avtext.runs.load_run` (an `avtext.runs.Run`)."""
  from avtext import import_checkpoint as import_tool  # pylint: disable=g-import-not-at-top
  from avtext import runs  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    off.torch.save(mgr.get_model_state(), tmp / "model_0.pth")  # trainer_base._save_checkpoint
    run_dir = import_tool.import_checkpoint("coot", str(tmp / "model_0.pth"), str(tmp / "run"))
    return runs.load_run(run_dir)


# ---------------------------------------------------------------- XML (jayleicn/TVRetrieval)

def xml_model_config(**overrides):
  """train.py's model_config with the defaults of config.py / scripts/train.sh (video_sub,
  resnet_i3d: 3072-d video, 768-d subtitles and queries), `overrides` on top (an EasyDict)."""
  from easydict import EasyDict  # pylint: disable=g-import-not-at-top
  cfg = dict(
      merge_two_stream=True, cross_att=True, span_predictor_type="conv",
      encoder_type="transformer", add_pe_rnn=False, pe_type="cosine",
      visual_input_size=3072, sub_input_size=768, query_input_size=768, hidden_size=256,
      stack_conv_predictor_conv_kernel_sizes=-1, conv_kernel_size=5, conv_stride=1,
      max_ctx_l=100, max_desc_l=30, input_drop=0.1, cross_att_drop=0.1, drop=0.1,
      n_heads=4, initializer_range=0.02, ctx_mode="video_sub", margin=0.1,
      ranking_loss_type="hinge", lw_neg_q=1, lw_neg_ctx=1, lw_st_ed=0,
      use_hard_negative=False, hard_pool_size=20, use_self_attention=True, no_modular=False)
  unknown = sorted(set(overrides) - set(cfg))
  if unknown:
    raise ValueError(f"xml_model_config: {unknown} are not fields of train.py's model_config")
  return EasyDict({**cfg, **overrides})


def xml_model(official_dir: pathlib.Path, model_config, seed: int):
  """`XML(model_config)` as train.py builds it, its init drawn after torch.manual_seed(seed)."""
  common.import_checkout(official_dir, packages=("baselines", "utils"))
  import torch  # pylint: disable=g-import-not-at-top
  from baselines.crossmodal_moment_localization import model_xml  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  return model_xml.XML(model_config)


def xml_import(model, config):
  """`model` saved as train.py saves it, torch.save({"model": state_dict, "model_cfg":
  model.config, "epoch": ...}), imported with `import_checkpoint("xml", ..., config)` and
  opened with `avtext.runs.load_run` (an `avtext.runs.Run`)."""
  import torch  # pylint: disable=g-import-not-at-top
  from avtext import import_checkpoint as import_tool  # pylint: disable=g-import-not-at-top
  from avtext import runs  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    ckpt = pathlib.Path(tmp) / "model.ckpt"
    torch.save({"model": model.state_dict(), "model_cfg": model.config, "epoch": 0}, ckpt)
    run_dir = import_tool.import_checkpoint("xml", str(ckpt), str(pathlib.Path(tmp) / "run"),
                                           config)
    return runs.load_run(run_dir)


def xml_official_loss(model, inputs: dict):
  """(loss, its parts) of the official `model(**inputs)` without randomness: eval mode (no
  dropout), span loss weight 0.01 (`set_train_st_ed`), hard negatives with a pool of 1, so
  that its sampled negative is the hardest one (the uniform draw of the default is no draw
  two RNGs share)."""
  import torch  # pylint: disable=g-import-not-at-top
  model.eval()
  model.set_hard_negative(True, 1)
  model.set_train_st_ed(0.01)
  with torch.no_grad():
    return model(**inputs)


def xml_avtext_loss(run, batch: dict, seed: int = 0):
  """(loss, aux) of `XMLTask.loss_fn` with `run`'s weights on `batch`, as
  `xml_official_loss`: model dropout 0, hard negatives with a pool of 1 from epoch 0."""
  import copy  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry as tasks  # pylint: disable=g-import-not-at-top
  config = copy.deepcopy(run.config)
  config.model.dropout_rate = config.model.input_dropout_rate = 0.0
  config.loss.hard_negatives_from_epoch, config.loss.hard_pool_size = 0, 1
  task = tasks.build_task(config)
  loss, aux, _ = task.loss_fn({"params": run.params, **run.model_state}, batch,
                              jax.random.PRNGKey(seed))
  return loss, aux

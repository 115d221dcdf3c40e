r"""COOT train step: avtext (JAX) beside the official PyTorch COOT, same batch, one process.

    make bench-venv      # .venv-bench: requirements.lock + requirements-bench.txt (torch CPU)
    git -C <mirror of simon-ging/coot-videotext> archive HEAD coot nntrainer config repo_config.py \
        | tar -x -C <coot checkout>
    .venv-bench/bin/python -m benchmarks.speed.coot_train_step --coot_repo=<coot checkout> \
        [--steps=10 --block=5 --warmup=2]

The official code is imported from `--coot_repo` (a checkout of simon-ging/coot-videotext);
it is never vendored here. Both sides run ActivityNet's configuration
(`config/retrieval/paper2020/anet_coot.yaml` / `configs/coot_activitynet.py`, fp32, CPU):

- official: `RetrievalModelManager(cfg)`; one step = `encode_visual` + `encode_text`, the
  loss exactly as `RetrievalTrainer.train_model` composes it (its own
  `compute_total_constrastive_loss` + `compute_cyclecons_loss`, called on a stand-in for
  the trainer), `backward`, `optimizer.step` (Adam 1e-3, wd 2e-5, from `make_optimizer`).
- avtext: `Trainer.make_train_step` — the jitted step `make train` runs (value_and_grad
  of the task loss, optax update, reduce-on-plateau scaling), state donated.

The batch: 64 videos with 2-8 clips each (P = .25 .30 .20 .12 .07 .04 .02, mean 3.66 as
ActivityNet-captions' 3.65 segments per video), videos of min(80, U[40, 200]) 2048-d
frames, clips of U[10, 80] frames (segments expanded to >= 10, at most 80 sampled),
sentences of U[8, 24] tokens, paragraphs = [CLS] + sentences + [SEP], 1536-d; all standard
normal from `--seed`. Official tensors follow `RetrievalDataset.collate_fn`; ours go
through `CootTask.collate` (axes padded to the batch's longest, rounded up to the config's
multiples) with the config's `data.pack_sequences`: clips, sentences, videos and paragraphs
several to a row, so the local transformers skip most padding (`--no_packing`: one per
row, as the official code).
Before timing, a child process (both frameworks) checks step 1's loss on this batch with
the same weights: the official model as the timed side builds it (seed 0) is saved as
nntrainer saves checkpoints (`mgr.get_model_state()`), imported with
`avtext.import_checkpoint` and opened with `avtext.runs.load_run` (`common.official`); both losses without dropout (eval / train=False) and with the CMC over all clips
(`CycleConsistencyLoss(num_samples=-1)` / `config.loss.cycle_samples=-1`: the trainer's one
random clip per video is no draw two RNGs share). It prints "step-1 loss, same weights, no
dropout: official X, avtext Y" and stops unless they agree to a relative 1e-4, and unless
our padded and packed layouts agree to a relative 1e-5.
Timings: each side runs alone in its own process (as in training: no second framework's
thread pool beside it), `--warmup` untimed then `--block` timed steps; processes alternate
official / avtext until each side has `--steps` timed steps (load drifts hit both); median
and IQR. The timed steps start from each side's own random init (and train with dropout),
so their losses differ; both optimizers run at a constant lr 1e-3 (no warm-up), and the
losses on the repeated batch are a sanity check that both steps train.
--quick: 8 videos, 2 timed steps a side. Rows: each side's median step and IQR, the ratio,
the same-weights step-1 losses and the parameter counts.
"""
import os
import pathlib

from absl import flags
import numpy as np

from benchmarks import common
from benchmarks.common import official as off_lib
from benchmarks.common import side_by_side

_COOT_REPO = flags.DEFINE_string("coot_repo", None, "checkout of simon-ging/coot-videotext",
                                 required=True)
_VIDEOS = flags.DEFINE_integer("videos", 64, "videos in the batch")
_STEPS_PER_EPOCH = flags.DEFINE_integer("steps_per_epoch", 157,
                                        "ActivityNet: 10009 train videos / 64")
_NO_PACKING = flags.DEFINE_bool("no_packing", False, "our side on the padded layout "
                                "(data.pack_sequences=False)")
side_by_side.define_flags()
SYSTEM = "COOT"

LOSS_RTOL = 1e-4  # official vs avtext, step-1 loss with the same weights
CLIP_P = {2: .25, 3: .30, 4: .20, 5: .12, 6: .07, 7: .04, 8: .02}


def make_batch(seed: int, num_videos: int = 64, video_dim: int = 2048, text_dim: int = 1536):
  """A list of per-video dicts in `CootTask.example`'s format (frames already sampled)."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(num_videos):
    n = int(rng.choice(list(CLIP_P), p=list(CLIP_P.values())))
    clip_lengths = rng.integers(10, 81, n).astype(np.int32)
    sentence_lengths = rng.integers(8, 25, n).astype(np.int32)
    sentence_lengths[0] += 1  # [CLS]
    sentence_lengths[-1] += 1  # [SEP]
    frames = int(min(80, rng.integers(40, 201)))
    examples.append({
        "video": rng.standard_normal((frames, video_dim), np.float32),
        "clip_frames": rng.standard_normal((int(clip_lengths.sum()), video_dim), np.float32),
        "clip_lengths": clip_lengths,
        "paragraph": rng.standard_normal((int(sentence_lengths.sum()), text_dim), np.float32),
        "sentence_lengths": sentence_lengths,
        "id": f"v{i}",
    })
  return examples


# ------------------------------------------------------------------ official
def official_batch(examples, th, batch_cls):
  """`RetrievalDataset.collate_fn`'s tensors (mask True = padding) from the same arrays."""
  def pad(seqs):
    lens = [len(s) for s in seqs]
    out = th.zeros(len(seqs), max(lens), seqs[0].shape[-1])
    mask = th.ones(len(seqs), max(lens), dtype=th.bool)
    for i, s in enumerate(seqs):
      out[i, :len(s)] = th.from_numpy(s)
      mask[i, :len(s)] = False
    return out, mask, th.tensor(lens, dtype=th.long)

  clips = [c for e in examples for c in np.split(e["clip_frames"], np.cumsum(e["clip_lengths"])[:-1])]
  sents = [s for e in examples
           for s in np.split(e["paragraph"], np.cumsum(e["sentence_lengths"])[:-1])]
  vid, vid_mask, vid_len = pad([e["video"] for e in examples])
  par, par_mask, par_len = pad([e["paragraph"] for e in examples])
  clip, clip_mask, clip_len = pad(clips)
  sent, sent_mask, sent_len = pad(sents)
  num = th.tensor([len(e["clip_lengths"]) for e in examples], dtype=th.long)
  keys = [e["id"] for e in examples]
  return batch_cls(
      key=keys, data_key=keys, sentences=[[]] * len(keys), vid_feat=vid, vid_feat_mask=vid_mask,
      vid_feat_len=vid_len, par_feat=par, par_feat_mask=par_mask, par_feat_len=par_len,
      clip_num=num, clip_feat=clip, clip_feat_mask=clip_mask, clip_feat_len=clip_len,
      sent_num=num.clone(), sent_feat=sent, sent_feat_mask=sent_mask, sent_feat_len=sent_len)


def official_step_fn(repo: pathlib.Path, examples, threads: int):
  off = off_lib.coot(repo)  # (restores the collections ABCs the official code needs)
  th = off.torch
  th.set_num_threads(threads)
  cfg, mgr = off_lib.coot_manager(off, repo, seed=0)
  mgr.set_all_models_train()
  params, _, _ = mgr.get_all_params()
  optimizer = off.optimization.make_optimizer(cfg.optimizer, params)
  # The trainer's own loss methods, bound to a stand-in holding what they read.
  shim = off_lib.coot_stand_in_trainer(off, cfg)
  batch = official_batch(examples, th, off.data.RetrievalDataBatchTuple)
  num_params = sum(p.numel() for m in mgr.model_dict.values() for p in m.parameters())

  def step() -> float:
    optimizer.zero_grad()
    visual = mgr.encode_visual(batch)
    text = mgr.encode_text(batch)
    loss = shim.compute_total_constrastive_loss(visual, text) + shim.compute_cyclecons_loss(
        visual, text)
    loss.backward()
    optimizer.step()
    return float(loss)

  return step, num_params, th.__version__


# ------------------------------------------------------------------ avtext
def avtext_task(examples, *, pack: bool = True, config=None):
  """(config, task) of our side: `config` (default configs/coot_activitynet.py) at float32
  on the CPU, shapes as the official collate's, `data.pack_sequences` as given."""
  from avtext.tasks import task_registry as tasks  # pylint: disable=g-import-not-at-top
  if config is None:
    config = common.load_config("configs/coot_activitynet.py")
  config.model.video_dim = examples[0]["video"].shape[-1]
  side_by_side.cpu_float32(config)
  # As the official collate: every axis padded to the batch's longest (rounded up to
  # data.pad_multiple), not to its maximum (the TPU configs' static shapes).
  config.data.static_shapes = False
  config.data.pack_sequences = pack
  # A constant lr 1e-3 as the official optimizer here (its warm-up lives in the scheduler,
  # which this benchmark does not step): both losses should fall alike on the one batch.
  config.optimizer.warmup_epochs, config.optimizer.warmup_steps = None, 0
  return config, tasks.build_task(config)


def arrays(batch: dict) -> dict:
  return {k: v for k, v in batch.items() if isinstance(v, np.ndarray) and v.dtype != object}


def avtext_step_fn(examples, steps_per_epoch: int, pack: bool):
  import jax  # pylint: disable=g-import-not-at-top
  config, task = avtext_task(examples, pack=pack)
  batch = arrays(task.collate(examples))
  shapes = {k: v.shape for k, v in batch.items()}
  step, num_params = side_by_side.avtext_step(config, task, batch, steps_per_epoch)
  return step, num_params, shapes, jax.__version__


def same_weights_check(repo: pathlib.Path, examples) -> dict:
  """Step 1's training loss on the benchmark's batch, the same weights on both sides, no
  randomness: the official model as `official_step_fn` builds it (seed 0), in eval mode,
  imported with `import_checkpoint` (`official.coot_import`); the CMC over all clips
  (CycleConsistencyLoss(num_samples=-1) / config.loss.cycle_samples=-1: the trainer's one
  random clip per video is no draw two RNGs share). Ours on the padded and on the packed
  layout (`data.pack_sequences`): the same function, so equal up to float rounding."""
  import jax  # pylint: disable=g-import-not-at-top
  off = off_lib.coot(repo)
  cfg, mgr = off_lib.coot_manager(off, repo, seed=0)
  mgr.set_all_models_eval()
  run = off_lib.coot_import(off, mgr)
  stand_in = off_lib.coot_stand_in_trainer(off, cfg, num_samples=-1)
  batch = official_batch(examples, off.torch, off.data.RetrievalDataBatchTuple)
  with off.torch.no_grad():
    visual, text = mgr.encode_visual(batch), mgr.encode_text(batch)
    out = {"official": float(stand_in.compute_total_constrastive_loss(visual, text)
                             + stand_in.compute_cyclecons_loss(visual, text))}
  variables = {"params": run.params, **run.model_state}
  for pack in (False, True):
    config = run.config.copy_and_resolve_references()
    with config.unlocked():
      config.loss.cycle_samples = -1
    _, task = avtext_task(examples, pack=pack, config=config)
    batch = arrays(task.collate(examples))
    loss = jax.jit(lambda v, b, t=task: t.loss(*t._encode(v, b, train=False),  # pylint: disable=protected-access
                                               jax.random.PRNGKey(1))[0])
    out["packed" if pack else "padded"] = float(loss(variables, batch))
    out[f"{'packed' if pack else 'padded'}_clip_rows"] = int(batch["clips"].shape[0])
  return out


def run_side(flag) -> None:
  """Child process: build one side, `--warmup` then `--steps` timed steps; print JSON."""
  threads = os.cpu_count()
  examples = make_batch(flag.seed, flag.videos)
  info = {"clips": sum(len(e["clip_lengths"]) for e in examples)}
  if flag.side == "official":
    step, info["params"], info["version"] = official_step_fn(
        pathlib.Path(flag.coot_repo), examples, threads)
  else:
    step, info["params"], shapes, info["version"] = avtext_step_fn(
        examples, flag.steps_per_epoch, not flag.no_packing)
    info["shapes"] = {k: list(v) for k, v in shapes.items() if len(v) > 1}
  side_by_side.time_steps(step, flag.warmup, flag.steps, info)


def main(argv):
  del argv
  flag = flags.FLAGS
  repo = off_lib.require(pathlib.Path(flag.coot_repo), "coot-videotext")
  videos = 8 if common.quick() else flag.videos
  plan = side_by_side.dispatch(
      flag, lambda: same_weights_check(repo, make_batch(flag.seed, videos)),
      lambda: run_side(flag))
  if plan is None:
    return
  steps, block, warmup = plan
  check = side_by_side.result(common.child(f"--coot_repo={repo}", "--check",
                                           f"--seed={flag.seed}", f"--videos={videos}"))
  timed = "padded" if flag.no_packing else "packed"  # the layout our timed step runs
  print(f"step-1 loss, same weights, no dropout: official {check['official']:.6f}, avtext "
        f"{check[timed]:.6f}", flush=True)
  print(f"avtext's layouts: padded ({check['padded_clip_rows']} clip rows) "
        f"{check['padded']:.6f}, packed ({check['packed_clip_rows']} rows) "
        f"{check['packed']:.6f}", flush=True)
  if not np.isclose(check["packed"], check["padded"], rtol=1e-5, atol=0):
    raise SystemExit("packed and padded losses differ beyond float rounding")
  if not np.isclose(check[timed], check["official"], rtol=LOSS_RTOL, atol=0):
    raise SystemExit(f"step-1 losses with the same weights differ beyond rtol {LOSS_RTOL:g}")
  results = side_by_side.alternate(
      lambda side, n: common.child(
          f"--coot_repo={repo}", f"--side={side}", f"--steps={n}", f"--warmup={warmup}",
          f"--seed={flag.seed}", f"--videos={videos}",
          f"--steps_per_epoch={flag.steps_per_epoch}",
          *(["--no_packing"] if flag.no_packing else [])),
      steps, block)
  first = {side: r[0] for side, r in results.items()}
  print(f"\n{common.cpu_name()}, {os.cpu_count()} cores; torch "
        f"{first['official']['version']}, jax {first['avtext']['version']}")
  print(f"batch: {videos} videos, {first['avtext']['clips']} clips; avtext shapes "
        + ", ".join(f"{k} {tuple(v)}" for k, v in first["avtext"]["shapes"].items()
                    if k in ("clips", "sentences", "video", "paragraph")))
  print(f"params: official {first['official']['params'] / 1e6:.2f} M, "
        f"avtext {first['avtext']['params'] / 1e6:.2f} M")
  timing = side_by_side.summary(results, steps, block, warmup)
  table = (f"anet_coot.yaml, float32, {videos} videos / {first['avtext']['clips']} clips, "
           f"{'padded' if flag.no_packing else 'packed'}")
  side_by_side.record_summary(SYSTEM, table, timing, "official PyTorch COOT")
  for side in ("official", "avtext"):
    name = "official PyTorch COOT" if side == "official" else "avtext (JAX)"
    common.record(SYSTEM, name, check[timed if side == "avtext" else side], table=table,
                  column="step-1 loss, same weights, no dropout", digits=7)
    common.record(SYSTEM, name, first[side]["params"] / 1e6, unit="M", table=table,
                  column="parameters", digits=3)


if __name__ == "__main__":
  common.main(main)

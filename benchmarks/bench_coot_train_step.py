r"""COOT train step: avtext (JAX) beside the official PyTorch COOT, same batch, one process.

    make bench-venv      # .venv-bench: requirements.lock + requirements-bench.txt (torch CPU)
    git -C <mirror of simon-ging/coot-videotext> archive HEAD coot nntrainer config repo_config.py \
        | tar -x -C /tmp/coot-videotext
    .venv-bench/bin/python benchmarks/bench_coot_train_step.py --coot_repo=/tmp/coot-videotext

The official code is imported from `--coot_repo` (a checkout of simon-ging/coot-videotext);
it is never vendored here. Both sides run ActivityNet's configuration
(`config/retrieval/paper2020/anet_coot.yaml` / `configs/coot_activitynet.py`, fp32, CPU):

- official: `RetrievalModelManager(cfg)`; one step = `encode_visual` + `encode_text`, the
  loss exactly as `RetrievalTrainer.train_model` composes it (its own
  `compute_total_constrastive_loss` + `compute_cyclecons_loss`, called on a stand-in for
  the trainer), `backward`, `optimizer.step` (Adam 1e-3, wd 2e-5, from `make_optimizer`).
- avtext: `Trainer._make_train_step` — the jitted step `make train` runs (value_and_grad
  of the task loss, optax update, reduce-on-plateau scaling), state donated.

The batch: 64 videos with 2-8 clips each (P = .25 .30 .20 .12 .07 .04 .02, mean 3.66 as
ActivityNet-captions' 3.65 segments per video), videos of min(80, U[40, 200]) 2048-d
frames, clips of U[10, 80] frames (segments expanded to >= 10, at most 80 sampled),
sentences of U[8, 24] tokens, paragraphs = [CLS] + sentences + [SEP], 1536-d; all standard
normal from `--seed`. Official tensors follow `RetrievalDataset.collate_fn`; ours go
through `CootTask.collate` (clips packed, axes padded to the config's multiples).
Timings: `--warmup` steps, then `--steps` alternating official / ours; median and IQR.
"""
import argparse
import datetime
import importlib.util
import os
import pathlib
import platform
import sys
import time
import types

import numpy as np

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
  sys.path.insert(0, str(repo))
  # The official code predates Python 3.10, which moved these ABCs out of `collections`.
  import collections  # pylint: disable=g-import-not-at-top
  import collections.abc  # pylint: disable=g-import-not-at-top
  for name in ("Iterable", "Mapping", "MutableMapping", "Sequence"):
    if not hasattr(collections, name):
      setattr(collections, name, getattr(collections.abc, name))
  import torch as th  # pylint: disable=g-import-not-at-top
  from coot import dataset_retrieval  # pylint: disable=g-import-not-at-top
  from coot import loss_fn  # pylint: disable=g-import-not-at-top
  from coot import model_retrieval  # pylint: disable=g-import-not-at-top
  from coot import trainer_retrieval  # pylint: disable=g-import-not-at-top
  from coot.configs_retrieval import RetrievalConfig  # pylint: disable=g-import-not-at-top
  from nntrainer import optimization  # pylint: disable=g-import-not-at-top
  from nntrainer.utils_yaml import load_yaml_config_file  # pylint: disable=g-import-not-at-top

  th.set_num_threads(threads)
  th.manual_seed(0)
  config = load_yaml_config_file(repo / "config/retrieval/paper2020/anet_coot.yaml")
  config.update(use_cuda=False, fp16_train=False, fp16_val=False, cudnn_enabled=False,
                cudnn_benchmark=False)
  cfg = RetrievalConfig(config)
  mgr = model_retrieval.RetrievalModelManager(cfg)
  mgr.set_all_models_train()
  params, _, _ = mgr.get_all_params()
  optimizer = optimization.make_optimizer(cfg.optimizer, params)
  # The trainer's own loss methods, bound to a stand-in holding what they read.
  shim = types.SimpleNamespace(
      cfg=cfg, loss_contr=loss_fn.ContrastiveLoss(cfg.train.contrastive_loss_config.margin,
                                                 use_cuda=False),
      loss_cycle_cons=loss_fn.CycleConsistencyLoss(use_cuda=False))
  trainer_cls = trainer_retrieval.RetrievalTrainer
  for name in ("compute_align_loss", "compute_cluster_loss", "compute_total_constrastive_loss",
               "compute_cyclecons_loss"):
    setattr(shim, name, types.MethodType(getattr(trainer_cls, name), shim))
  batch = official_batch(examples, th, dataset_retrieval.RetrievalDataBatchTuple)
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
def avtext_step_fn(examples, steps_per_epoch: int):
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry as tasks  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "coot_activitynet", pathlib.Path(__file__).parents[1] / "configs/coot_activitynet.py")
  coot_config = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(coot_config)

  config = coot_config.get_config()
  config.model.video_dim = examples[0]["video"].shape[-1]
  task = tasks.build_task(config)
  batch = task.collate(examples)
  batch = {k: v for k, v in batch.items() if isinstance(v, np.ndarray) and v.dtype != object}
  shapes = {k: v.shape for k, v in batch.items()}
  # No evaluators run here; the trainer only checks the selection names one.
  trainer = trainer_lib.Trainer(config, "/tmp/bench_coot_unused", task, evaluators={"val": None})
  trainer.steps_per_epoch = steps_per_epoch
  trainer.total_steps = steps_per_epoch * config.train.num_epochs
  state, (tx, schedule) = trainer._init_state(batch)  # pylint: disable=protected-access
  train_step = trainer._make_train_step(  # pylint: disable=protected-access
      tx, schedule, trainer._state_sharding(state))  # pylint: disable=protected-access
  batch = partitioning.host_to_global(batch, trainer.mesh)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  holder = {"state": state}

  def step() -> float:
    holder["state"], metrics = train_step(holder["state"], batch)
    return float(metrics["loss"])  # blocks until the step is done

  return step, num_params, shapes, jax.__version__


def timed(step, n):
  out = []
  for _ in range(n):
    begin = time.perf_counter()
    step()
    out.append(time.perf_counter() - begin)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coot_repo", required=True, type=pathlib.Path,
                      help="checkout of simon-ging/coot-videotext")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--videos", type=int, default=64)
  parser.add_argument("--steps_per_epoch", type=int, default=157,
                      help="ActivityNet: 10009 train videos / 64")
  args = parser.parse_args()
  if not (args.coot_repo / "coot" / "model_retrieval.py").is_file():
    raise SystemExit(f"--coot_repo={args.coot_repo}: no coot/model_retrieval.py; pass a checkout "
                     "of simon-ging/coot-videotext (see the module docstring)")
  threads = os.cpu_count()
  examples = make_batch(args.seed, args.videos)
  clips = sum(len(e["clip_lengths"]) for e in examples)

  official, official_params, torch_version = official_step_fn(args.coot_repo, examples, threads)
  ours, our_params, shapes, jax_version = avtext_step_fn(examples, args.steps_per_epoch)
  first = {"official": official(), "avtext": ours()}  # includes jit compilation for ours
  for _ in range(args.warmup - 1):
    official(), ours()
  times = {"official": [], "avtext": []}
  losses = {"official": [], "avtext": []}
  for _ in range(args.steps):  # interleaved, so drifts in machine load hit both
    for name, fn in (("official", official), ("avtext", ours)):
      begin = time.perf_counter()
      losses[name].append(fn())
      times[name].append(time.perf_counter() - begin)

  cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
              if l.startswith("model name")), platform.processor())
  print(f"date {datetime.date.today()}, {cpu}, {threads} cores; torch {torch_version} "
        f"({threads} threads), jax {jax_version}")
  print(f"batch: {args.videos} videos, {clips} clips; avtext padded shapes "
        + ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items() if v and len(v) > 1))
  print(f"params: official {official_params / 1e6:.2f} M, avtext {our_params / 1e6:.2f} M")
  print(f"first-step loss: official {first['official']:.4f}, avtext {first['avtext']:.4f}; "
        f"after {args.warmup + args.steps} steps: official {losses['official'][-1]:.4f}, "
        f"avtext {losses['avtext'][-1]:.4f}")
  print("\n| implementation | step median (s) | IQR (s) |\n|---|---|---|")
  med = {}
  for name, t in times.items():
    q1, med[name], q3 = np.percentile(t, [25, 50, 75])
    print(f"| {name} | {med[name]:.3f} | {q1:.3f}-{q3:.3f} |")
  print(f"\nspeed ratio official/avtext: {med['official'] / med['avtext']:.2f}x "
        f"(>1: avtext faster); {args.steps} interleaved steps after {args.warmup} warm-up")


if __name__ == "__main__":
  main()

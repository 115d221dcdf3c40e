r"""XML train step: avtext (JAX) beside the official PyTorch XML, same batch, one process each.

    make bench-venv      # .venv-bench: requirements.lock + requirements-bench.txt (torch CPU)
    git -C <mirror of jayleicn/TVRetrieval> archive HEAD baselines utils \
        | tar -x -C <TVRetrieval checkout>
    .venv-bench/bin/python -m benchmarks.speed.xml_train_step --tvr_repo=<TVRetrieval checkout> \
        [--steps=10 --block=5 --warmup=2]
    python -m benchmarks.speed.xml_train_step --ab_rounds=12    # ours only: the A/B below

The official code is imported from `--tvr_repo` (a checkout of jayleicn/TVRetrieval); it is
never vendored here. Both sides run the official defaults (train.py + scripts/train.sh tvr
video_sub resnet_i3d; `configs/xml_tvr.py`), fp32, CPU:

- official: `XML(model_config)` as train.py builds it (hidden 256, 4 heads, dropout 0.1,
  ConvSE k=5, merged streams, cross-attention), span loss on (`set_train_st_ed(0.01)`,
  hard negatives off), one step = forward (its loss) + backward + `BertAdam.step`
  (lr 1e-4, 1 % warmup_linear, wd 0.01 except bias / LayerNorm, per-tensor clip 1).
- avtext: `Trainer.make_train_step` on `configs/xml_tvr.py` (the jitted, donated step
  `make demo-xml` runs).

The batch: 128 queries, each with its own video of U[40, 100] 1.5 s clips (3072-d video,
768-d subtitle features), query tokens U[8, 30] (768-d), a moment of 2-16 clips; all
standard normal from `--seed`. The official tensors are padded to the batch's longest
(its collate); ours to `max_ctx_len` = 100 / `max_query_len` = 30 (fixed shapes).
Before timing, a child process (both frameworks) checks step 1's loss on this batch with
the same weights: the official model as the timed side builds it (seed 0) is saved as
train.py saves checkpoints ({"model", "model_cfg", "epoch"}), imported with
`avtext.import_checkpoint` onto our config and opened with `avtext.runs.load_run`
(`common.official`); both losses without dropout (eval / dropout rate 0) and with the
hardest in-batch negative (a hard pool of 1 on both sides, as the parity suite: the
default's uniform negative draw is no draw two RNGs share). It prints "step-1 loss, same
weights, no dropout: official X, avtext Y" and stops unless they agree to a relative 1e-4.
Timings: each side alone in its own process from its own random init, `--warmup` untimed
then `--block` timed steps, the processes alternating until each side has `--steps`;
median and IQR.

With --ab_rounds=N (no official code needed), our step alone with and without the CPU
matmul / reduction forms of `avtext.ops`, in one process on the same batch: "plain" builds
the model with `config.model.backend="tpu"`, which replaces `ops.dense_matmul` and
`ops.broadcast_leading` by the plain product and broadcast, "ops" as the code is on the
CPU; after one untimed step each, N rounds time one step of each, the order flipping every
round, so load on a shared machine hits both alike; the medians and their ratio.
--quick: 16 queries, 2 timed steps a side (or 2 A/B rounds). Rows: each side's median
step and IQR, the ratio, the same-weights step-1 losses, the parameter counts; the A/B's
medians and ratio.
"""
import os
import pathlib
import time

from absl import flags
import numpy as np

from benchmarks import common
from benchmarks.common import official as off_lib
from benchmarks.common import side_by_side

_TVR_REPO = flags.DEFINE_string("tvr_repo", None, "checkout of jayleicn/TVRetrieval")
_QUERIES = flags.DEFINE_integer("queries", 128, "queries in the batch")
_STEPS_PER_EPOCH = flags.DEFINE_integer("steps_per_epoch", 851,
                                        "TVR: 108,965 training queries / 128")
_AB_ROUNDS = flags.DEFINE_integer("ab_rounds", 0, "time our step with and without the CPU "
                                  "forms of avtext.ops instead (module docstring)")
side_by_side.define_flags()
SYSTEM = "TVR: XML"

LOSS_RTOL = 1e-4  # official vs avtext, step-1 loss with the same weights
CFG = dict(video_dim=3072, sub_dim=768, query_dim=768, max_ctx=100, max_query=30)


def make_batch(seed: int, n: int = 128) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    clips = int(rng.integers(40, CFG["max_ctx"] + 1))
    tokens = int(rng.integers(8, CFG["max_query"] + 1))
    length = int(rng.integers(2, 17))
    st = int(rng.integers(0, clips - length + 1))
    out.append({"video": rng.standard_normal((clips, CFG["video_dim"]), np.float32),
                "sub": rng.standard_normal((clips, CFG["sub_dim"]), np.float32),
                "query": rng.standard_normal((tokens, CFG["query_dim"]), np.float32),
                "st": st, "ed": st + length - 1})
  return out


def _pad(seqs, length=None):
  length = length or max(len(s) for s in seqs)
  out = np.zeros((len(seqs), length, seqs[0].shape[-1]), np.float32)
  mask = np.zeros((len(seqs), length), np.float32)
  for i, s in enumerate(seqs):
    out[i, :len(s)], mask[i, :len(s)] = s, 1
  return out, mask


# ------------------------------------------------------------------ official
def official_model(repo: pathlib.Path):
  """`XML(model_config)` as train.py builds it with the config.py / train.sh defaults
  (hidden 256, 4 heads, dropout 0.1, ConvSE k=5), seed 0."""
  return off_lib.xml_model(repo, off_lib.xml_model_config(
      visual_input_size=CFG["video_dim"], sub_input_size=CFG["sub_dim"],
      query_input_size=CFG["query_dim"], max_ctx_l=CFG["max_ctx"],
      max_desc_l=CFG["max_query"]), seed=0)


def official_inputs(th, examples) -> dict:
  """`model(**inputs)` of the official forward: padded to the batch's longest."""
  video, vmask = _pad([e["video"] for e in examples])
  sub, smask = _pad([e["sub"] for e in examples])
  query, qmask = _pad([e["query"] for e in examples])
  return dict(query_feat=th.from_numpy(query), query_mask=th.from_numpy(qmask),
              video_feat=th.from_numpy(video), video_mask=th.from_numpy(vmask),
              sub_feat=th.from_numpy(sub), sub_mask=th.from_numpy(smask),
              tef_feat=None, tef_mask=None,
              st_ed_indices=th.tensor([[e["st"], e["ed"]] for e in examples]))


def official_step_fn(repo: pathlib.Path, examples, threads: int, steps_per_epoch: int):
  model = official_model(repo)
  import torch as th  # pylint: disable=g-import-not-at-top
  from baselines.crossmodal_moment_localization.optimization import BertAdam  # pylint: disable=g-import-not-at-top

  th.set_num_threads(threads)
  model.set_train_st_ed(0.01)
  model.train()
  no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
  named = list(model.named_parameters())
  groups = [{"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
             "weight_decay": 0.01},
            {"params": [p for n, p in named if any(nd in n for nd in no_decay)],
             "weight_decay": 0.0}]
  optimizer = BertAdam(groups, lr=1e-4, weight_decay=0.01, warmup=0.01,
                       t_total=steps_per_epoch * 100, schedule="warmup_linear")
  inputs = official_inputs(th, examples)
  num_params = sum(p.numel() for p in model.parameters())

  def step() -> float:
    loss, _ = model(**inputs)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss)

  return step, num_params, th.__version__, list(inputs["video_feat"].shape)


# ------------------------------------------------------------------ avtext
def avtext_config():
  """configs/xml_tvr.py at float32 on the CPU."""
  config = common.load_config("configs/xml_tvr.py")
  side_by_side.cpu_float32(config)
  return config


def avtext_batch(examples) -> dict:
  """Our batch: padded to max_ctx_len / max_query_len (fixed shapes)."""
  video, vmask = _pad([e["video"] for e in examples], CFG["max_ctx"])
  sub, _ = _pad([e["sub"] for e in examples], CFG["max_ctx"])
  query, qmask = _pad([e["query"] for e in examples], CFG["max_query"])
  return {"video": video, "sub": sub, "ctx_mask": vmask.astype(np.int32), "query": query,
          "query_mask": qmask.astype(np.int32),
          "start": np.asarray([e["st"] for e in examples], np.int32),
          "end": np.asarray([e["ed"] for e in examples], np.int32),
          "epoch": np.zeros(len(examples), np.int32)}  # before the hard-negative epochs


def avtext_step_fn(examples, steps_per_epoch: int, backend: str | None = None):
  """Our step on `examples`, its model built for `backend` (`config.model.backend`)."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry as tasks  # pylint: disable=g-import-not-at-top
  config = avtext_config()
  config.model.backend = backend
  task = tasks.build_task(config)
  batch = avtext_batch(examples)
  step, num_params = side_by_side.avtext_step(config, task, batch, steps_per_epoch)
  return step, num_params, jax.__version__, list(batch["video"].shape)


def same_weights_check(repo: pathlib.Path, examples) -> dict:
  """Step 1's training loss on the benchmark's batch, the same weights on both sides, no
  randomness: the official model as `official_step_fn` builds it (seed 0), imported with
  `import_checkpoint` onto our config (`official.xml_import`); both losses without
  dropout and with the hardest in-batch negative (a hard pool of 1: the default's uniform
  draw is no draw two RNGs share), as the parity suite compares them
  (`official.xml_official_loss` / `xml_avtext_loss`). Each side on its own padding of the batch."""
  import torch  # pylint: disable=g-import-not-at-top
  model = official_model(repo)
  run = off_lib.xml_import(model, avtext_config())
  official, _ = off_lib.xml_official_loss(model, official_inputs(torch, examples))
  ours, _ = off_lib.xml_avtext_loss(run, avtext_batch(examples))
  return {"official": float(official), "avtext": float(ours)}


def run_side(flag) -> None:
  threads = os.cpu_count()
  examples = make_batch(flag.seed, flag.queries)
  info = {}
  if flag.side == "official":
    step, info["params"], info["version"], info["video_shape"] = official_step_fn(
        pathlib.Path(flag.tvr_repo), examples, threads, flag.steps_per_epoch)
  else:
    step, info["params"], info["version"], info["video_shape"] = avtext_step_fn(
        examples, flag.steps_per_epoch)
  side_by_side.time_steps(step, flag.warmup, flag.steps, info)


def ab(rounds: int, queries: int, seed: int) -> None:
  """Our step with ("ops") and without ("plain") the CPU forms of avtext.ops, alternating."""
  examples = make_batch(seed, queries)
  steps = {}
  # "plain" is built for another backend (config.model.backend), which drops the CPU forms.
  for name, platform in (("plain", "tpu"), ("ops", "cpu")):
    steps[name] = avtext_step_fn(examples, _STEPS_PER_EPOCH.value, backend=platform)[0]
    print(f"{name}: step-1 loss {steps[name]():.6f}", flush=True)  # traced and compiled here
  times = {name: [] for name in steps}
  for i in range(rounds):
    for name in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
      begin = time.perf_counter()
      steps[name]()
      times[name].append(time.perf_counter() - begin)
  for name, t in times.items():
    print(f"{name}: " + " ".join(f"{x:.3f}" for x in t))
  med = {name: float(np.median(t)) for name, t in times.items()}
  paired = np.asarray(times["plain"]) / np.asarray(times["ops"])
  print(f"median step: plain {med['plain']:.3f} s, ops {med['ops']:.3f} s; plain/ops "
        f"{med['plain'] / med['ops']:.3f} (per round: median {np.median(paired):.3f}, "
        f"range {paired.min():.3f}-{paired.max():.3f}); {rounds} rounds")
  table = (f"our step alone, plain products vs the CPU forms of avtext.ops, {queries} queries, "
           f"median of {rounds} alternated rounds")
  common.record(SYSTEM, "plain products and broadcasts", med["plain"], unit="s", table=table)
  common.record(SYSTEM, "avtext.ops' CPU forms (the code)", med["ops"], unit="s", table=table)
  common.record(SYSTEM, "plain / ops", med["plain"] / med["ops"], unit="x", table=table,
                digits=4)


def main(argv):
  del argv
  flag = flags.FLAGS
  queries = 16 if common.quick() else flag.queries
  if flag.ab_rounds:
    ab(2 if common.quick() else flag.ab_rounds, queries, flag.seed)
    return
  if not flag.tvr_repo:
    raise SystemExit("--tvr_repo: a checkout of jayleicn/TVRetrieval (or --ab_rounds=N)")
  repo = off_lib.require(pathlib.Path(flag.tvr_repo), "TVRetrieval")
  plan = side_by_side.dispatch(
      flag, lambda: same_weights_check(repo, make_batch(flag.seed, queries)),
      lambda: run_side(flag))
  if plan is None:
    return
  steps, block, warmup = plan
  check = side_by_side.result(common.child(f"--tvr_repo={repo}", "--check",
                                           f"--seed={flag.seed}", f"--queries={queries}"))
  print(f"step-1 loss, same weights, no dropout: official {check['official']:.6f}, avtext "
        f"{check['avtext']:.6f} (the hardest in-batch negative on both sides)", flush=True)
  if not np.isclose(check["avtext"], check["official"], rtol=LOSS_RTOL, atol=0):
    raise SystemExit(f"step-1 losses with the same weights differ beyond rtol {LOSS_RTOL:g}")
  results = side_by_side.alternate(
      lambda side, n: common.child(
          f"--tvr_repo={repo}", f"--side={side}", f"--steps={n}", f"--warmup={warmup}",
          f"--seed={flag.seed}", f"--queries={queries}",
          f"--steps_per_epoch={flag.steps_per_epoch}"),
      steps, block)
  first = {side: r[0] for side, r in results.items()}
  print(f"\n{common.cpu_name()}, {os.cpu_count()} cores; torch "
        f"{first['official']['version']}, jax {first['avtext']['version']}")
  print(f"video batch: official {first['official']['video_shape']} (padded to the batch max), "
        f"avtext {first['avtext']['video_shape']} (max_ctx_len)")
  print(f"params: official {first['official']['params'] / 1e6:.3f} M, "
        f"avtext {first['avtext']['params'] / 1e6:.3f} M")
  timing = side_by_side.summary(results, steps, block, warmup)
  table = f"official defaults, float32, {queries} queries"
  side_by_side.record_summary(SYSTEM, table, timing, "official PyTorch XML")
  for side in ("official", "avtext"):
    name = "official PyTorch XML" if side == "official" else "avtext (JAX)"
    common.record(SYSTEM, name, check[side], table=table,
                  column="step-1 loss, same weights, no dropout", digits=6)
    common.record(SYSTEM, name, first[side]["params"] / 1e6, unit="M", table=table,
                  column="parameters", digits=4)


if __name__ == "__main__":
  common.main(main)

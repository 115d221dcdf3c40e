r"""COOT parity: the official coot-videotext model vs the imported avtext `coot` model.

    make test-parity    # the bench venv; checkouts under $AVTEXT_OFFICIAL (common/official.py)

Marked `needs_torch`: the default `make test` deselects it; it skips, saying why, where
torch or the checkout of gingsi/coot-videotext is missing. Steps:
1. The official `RetrievalModelManager` (coot/model_retrieval.py) of
   config/retrieval/paper2020/anet_coot.yaml (the paper's ActivityNet COOT, 2048-d
   video and 1536-d text features), float32, eval mode; every parameter
   re-randomized (weights ~ N(0, 1/fan_in), biases and the layer norms' gains and
   biases with noise around their init) so a wrong mapping or transposition shows.
2. Saved as nntrainer's `_save_checkpoint` saves it:
   th.save(model_mgr.get_model_state(), "model_0.pth") ({network: state_dict}).
3. Imported with `avtext.import_checkpoint.import_checkpoint("coot", ...)` into a
   temporary run directory with the default config (configs/coot_activitynet.py: the
   official function by default), opened with `avtext.runs.load_run`; the model is
   rebuilt from the run's config with config.model.dtype=float32 (the paper config
   computes in bfloat16 for its TPU slice; parameters are float32 either way).
4. One batch of 4 videos with 3, 1, 5 and 2 clips, every clip, video, sentence and
   paragraph of a different length: the official collate (`RetrievalDataset.collate_fn`)
   pads it to the batch's longest, avtext's `CootTask.collate` to the config's static
   shapes (80 frames, 512 tokens, 32 clip slots per video).
5. Compared, per network call: the input layer norm, the input FC (after its GELU), the
   transformer layer's output at every position of the official padded axis (padded
   positions included: the official global mean sums them), the Contextual
   Transformer, the pooler, the network's pooled output; then the embeddings
   (video/paragraph, clip/sentence, contexts) and the training loss of
   trainer_retrieval.py (`compute_total_constrastive_loss` + `compute_cyclecons_loss`,
   called on a stand-in trainer) against `CootTask.loss`, term by term. The CMC term
   uses all clips (CycleConsistencyLoss(num_samples=-1) / config.loss.cycle_samples=-1):
   the training default draws one clip per video at random, which no two RNGs share;
   the per-clip cycle errors it draws from are compared as well.
The table is printed (`pytest -s`); the test fails if a row is outside its tolerance.
"""
import collections
import pathlib

import numpy as np
import pytest

from benchmarks.common import official

pytestmark = pytest.mark.needs_torch

CLIPS = (3, 1, 5, 2)  # clips (= sentences) per video



def _randomize(mgr, torch, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for net in mgr.model_dict.values():
      for name, p in net.named_parameters():
        if name.endswith("genpool_one"):
          continue  # a constant 1, unused
        noise = torch.randn(p.shape, generator=gen)
        if "layer_normalization" in name or "norm_input" in name:
          p.copy_((1.0 if name.endswith("gain") else 0.0) + 0.2 * noise)
        elif p.dim() == 1 or name.endswith(("b1_head", "b2_head")):
          p.copy_(0.1 * noise)
        else:  # Linear [out, in]: fan-in = in; GenPool w [heads, in, out]: fan-in = in
          fan_in = p.shape[-1] if p.dim() == 2 else p.shape[-2]
          p.copy_(noise / np.sqrt(fan_in))


def _items(rng, video_dim: int, text_dim: int):
  """Per video: frames of the video, of each clip, tokens of each sentence (all different)."""
  items = []
  for v, n in enumerate(CLIPS):
    clip_len = [int(x) for x in rng.integers(2, 12, size=n)]
    sent_len = [int(x) for x in rng.integers(3, 10, size=n)]
    items.append({
        "id": f"v{v}", "video": rng.normal(size=(int(rng.integers(6, 20)), video_dim)),
        "clips": [rng.normal(size=(k, video_dim)) for k in clip_len],
        "paragraph": rng.normal(size=(sum(sent_len), text_dim)), "sentence_lengths": sent_len})
  for item in items:
    for k in ("video", "paragraph"):
      item[k] = item[k].astype(np.float32)
    item["clips"] = [c.astype(np.float32) for c in item["clips"]]
  return items


def _official_batch(off, items):
  t = off.torch
  points = []
  for it in items:
    n = len(it["clips"])
    sents = np.split(it["paragraph"], np.cumsum(it["sentence_lengths"])[:-1])
    points.append(off.data.RetrievalDataPointTuple(
        it["id"], it["id"], ["s"] * n, t.from_numpy(it["video"]), len(it["video"]),
        t.from_numpy(it["paragraph"]), len(it["paragraph"]), n,
        [t.from_numpy(c) for c in it["clips"]], [len(c) for c in it["clips"]], n,
        [t.from_numpy(s) for s in sents], list(it["sentence_lengths"])))
  return off.data.RetrievalDataset.collate_fn(None, points)


def _our_batch(task, items):
  examples = [{"video": it["video"], "clip_frames": np.concatenate(it["clips"]),
               "clip_lengths": np.array([len(c) for c in it["clips"]], np.int32),
               "paragraph": it["paragraph"],
               "sentence_lengths": np.array(it["sentence_lengths"], np.int32), "id": it["id"]}
              for it in items]
  return task.collate(examples)


def _hook_outputs(off, mgr):
  """Forward hooks: {(network, part): [output per call]} of the official networks."""
  record = collections.defaultdict(list)

  def hook(key):
    def fn(_module, _inputs, output):
      record[key].append(output)
    return fn

  for net_name, net in mgr.model_dict.items():
    net.register_forward_hook(hook((net_name, "network")))
    for part in ("norm_input", "input_fc", "tf", "tf_context", "pooler"):
      module = getattr(net, part, None)
      if module is not None:
        module.register_forward_hook(hook((net_name, part)))
  del off
  return record


def _cut(ours, theirs):
  """ours sliced to the official (shorter: padded to the batch's longest) shape."""
  ours = np.asarray(ours)
  theirs = np.asarray(theirs)
  if ours.ndim != theirs.ndim or any(a < b for a, b in zip(ours.shape, theirs.shape)):
    raise ValueError(f"avtext {ours.shape} cannot hold official {theirs.shape}")
  return ours[tuple(slice(0, n) for n in theirs.shape)]


def run(official_dir: pathlib.Path, seed: int = 0):
  """(rows, extra lines) of the parity table."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from avtext.losses import coot as coot_losses  # pylint: disable=g-import-not-at-top
  from avtext.models import model_registry  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry as tasks  # pylint: disable=g-import-not-at-top
  max_abs_diff = official.max_abs_diff
  off = official.coot(official_dir)
  torch = off.torch
  cfg, mgr = official.coot_manager(off, official_dir, seed)
  yaml_file = official_dir / official.COOT_YAML
  _randomize(mgr, torch, seed)
  for net in mgr.model_dict.values():
    net.float().eval()
  ours = official.coot_import(off, mgr)
  config = ours.config
  with config.unlocked():
    config.model.dtype = "float32"  # the paper config computes in bfloat16 (TPU); parity: float32
    # Layer by layer against the official padded tensors: our padded layout too (packing
    # computes the same function: tests/test_tasks_coot.py).
    config.data.pack_sequences = False
  model = model_registry.build_model(config.model)
  extra = [f"official: {yaml_file.relative_to(official_dir)}, RetrievalModelManager, "
           f"{sum(p.numel() for n in mgr.model_dict.values() for p in n.parameters())} "
           f"parameters; avtext: configs/coot_activitynet.py (masked_pool="
           f"{config.model.masked_pool}), imported with import_checkpoint",
           f"batch: 4 videos with {list(CLIPS)} clips, every clip / video / sentence / "
           "paragraph of its own length (official collate: padded to the batch's longest; "
           "avtext: the config's static shapes)"]

  rng = np.random.default_rng(seed)
  items = _items(rng, int(config.model.video_dim), int(config.model.text_dim))
  batch = _official_batch(off, items)
  task = tasks.build_task(config)
  our_batch = _our_batch(task, items)

  record = _hook_outputs(off, mgr)
  with torch.no_grad():
    vis = mgr.encode_visual(batch)
    txt = mgr.encode_text(batch)

  variables = {"params": ours.params}
  args = (our_batch["video"], our_batch["video_mask"], our_batch["clips"],
          our_batch["clips_mask"], our_batch["clip_slot"], our_batch["paragraph"],
          our_batch["paragraph_mask"], our_batch["sentences"], our_batch["sentences_mask"],
          our_batch["clip_slot"])
  (video, text), inter = jax.jit(lambda v, a: model.apply(
      v, *a, capture_intermediates=True, mutable=["intermediates"]))(variables, args)
  inter = inter["intermediates"]

  rows = []

  def add(name, a, b):
    b = b.detach().numpy() if hasattr(b, "detach") else np.asarray(b)
    rows.append((name, max_abs_diff(_cut(a, b), b), "x".join(map(str, b.shape))))

  calls = {"net_video_local": ("video_local", ("video", "clips")),
           "net_video_global": ("video_global", ("video",)),
           "net_text_local": ("text_local", ("paragraph", "sentences")),
           "net_text_global": ("text_global", ("paragraph",))}
  for net, (module, call_names) in calls.items():
    mine = inter[module]
    for i, call in enumerate(call_names):
      label = f"{module}[{call}]"
      add(f"{label} norm_input", mine["norm_input"]["__call__"][i], record[(net, "norm_input")][i])
      if "input_fc" in mine:
        add(f"{label} input_fc + GELU",
            jax.nn.gelu(mine["input_fc"]["__call__"][i], approximate=False),
            record[(net, "input_fc")][i])
      add(f"{label} transformer layer (all official positions)",
          mine["encoderblock_0"]["__call__"][i], record[(net, "tf")][i])
      pooled, seq = mine["__call__"][i]
      official_pooled, official_seq = record[(net, "network")][i]
      if "context" in mine:
        add(f"{label} Contextual Transformer", mine["context"]["__call__"][i],
            record[(net, "tf_context")][i])
      if "pooler" in mine:
        add(f"{label} Attention-FA pooler", mine["pooler"]["__call__"][i],
            record[(net, "pooler")][i])
      else:
        add(f"{label} avg_special pooler", pooled[:, :int(config.model.hidden_size)],
            record[(net, "pooler")][i])
      add(f"{label} pooled output", pooled, official_pooled)
      add(f"{label} sequence output", seq, official_seq)

  clip_mask = np.asarray(video["clip_mask"])
  sent_mask = np.asarray(text["sentence_mask"])
  for name, a, b in (
      ("video_emb", video["video_emb"], vis.vid_emb),
      ("video_context", video["video_context"], vis.vid_context),
      ("clip_emb (flat)", np.asarray(video["clip_emb"])[clip_mask], vis.clip_emb),
      ("clip_emb (per video, padded)", video["clip_emb"], vis.clip_emb_reshape),
      ("paragraph_emb", text["paragraph_emb"], txt.par_emb),
      ("paragraph_context", text["paragraph_context"], txt.par_context),
      ("sentence_emb (flat)", np.asarray(text["sentence_emb"])[sent_mask], txt.sent_emb),
      ("sentence_emb (per video, padded)", text["sentence_emb"], txt.sent_emb_reshape)):
    add(name, a, b)

  # ---- the training loss: trainer_retrieval.py's, on a stand-in trainer
  stand_in = official.coot_stand_in_trainer(off, cfg, num_samples=-1)
  with torch.no_grad():
    contr = stand_in.compute_total_constrastive_loss(vis, txt)
    cycle = stand_in.compute_cyclecons_loss(vis, txt)
    norm = torch.nn.functional.normalize
    c = cfg.train.contrastive_loss_config
    terms = {
        "align_high": stand_in.compute_align_loss(norm(vis.vid_emb), norm(txt.par_emb)),
        "align_low": stand_in.compute_align_loss(norm(vis.clip_emb), norm(txt.sent_emb)),
        "align_context": stand_in.compute_align_loss(norm(vis.vid_context),
                                                     norm(txt.par_context)),
        "cluster_high": stand_in.compute_cluster_loss(norm(vis.vid_emb), norm(txt.par_emb)),
        "cluster_low": stand_in.compute_cluster_loss(norm(vis.clip_emb), norm(txt.sent_emb))}
    cc = stand_in.loss_cycle_cons
    clip_errors = cc.compute_loss_index_gauss(
        ~vis.clip_emb_mask, vis.clip_emb_lens, vis.clip_emb_mask.shape[1],
        cc.get_soft_nn(cc.get_soft_nn(vis.clip_emb_reshape, ~vis.clip_emb_mask,
                                      txt.sent_emb_reshape, ~txt.sent_emb_mask)[0],
                       ~vis.clip_emb_mask, vis.clip_emb_reshape, ~vis.clip_emb_mask)[1])[0]
  with config.unlocked():
    config.loss.cycle_samples = -1  # all clips, as num_samples=-1 above
  total, metrics, _ = task.loss(video, text, jax.random.PRNGKey(0))
  for name, value in terms.items():
    add(f"loss term {name}", metrics[name], value)
  add("loss term cycle (clip-clip + sentence-sentence)", metrics["cycle"],
      cycle / cfg.train.loss_cycle_cons)
  our_clip_errors, _ = coot_losses.cycle_consistency_errors(
      video["clip_emb"], video["clip_mask"], text["sentence_emb"], text["sentence_mask"])
  official_clip_errors = clip_errors.numpy() * (~vis.clip_emb_mask).numpy()
  add("cycle errors per clip (real clips)", _cut(our_clip_errors, official_clip_errors)
      * (~vis.clip_emb_mask).numpy(), official_clip_errors)
  add("training loss (eq. 9: contrastive + lambda CMC)", total, contr + cycle)
  extra.append(f"training loss: official {float(contr + cycle):.6f}, avtext {float(total):.6f}; "
               f"weights high {c.weight_high}, low {c.weight_low}, context {c.weight_context}, "
               f"clusters {c.weight_high_internal}/{c.weight_low_internal}, "
               f"CMC {cfg.train.loss_cycle_cons}")
  # The named option, for scale: our masked mean is not the official function on this batch.
  masked = model.clone(masked_pool=True)
  masked_video, masked_text = jax.jit(masked.apply)(variables, *args)
  extra.append("model.masked_pool=True (variant :masked_pool, not official): max |diff| "
               f"video_emb {max_abs_diff(masked_video['video_emb'], vis.vid_emb.numpy()):.2e}, "
               f"paragraph_emb "
               f"{max_abs_diff(masked_text['paragraph_emb'], txt.par_emb.numpy()):.2e}")
  del jnp
  return rows, extra


def test_coot_equals_the_official_code_on_the_same_weights():
  official.parity_test("coot-videotext", "coot", run)

"""COOT (Ging et al. 2020): hierarchical video-paragraph / clip-sentence retrieval.

A training example is one video of the `coot` dataset (`avtext.data.builders.coot`):
per-frame features of the whole video and of each of its N segments (clips),
and the paragraph's per-token text features split into N sentences. Frames are
sampled as the official code does (`video.coot_frame_indices`: up to
`data.max_frames` = 80 per clip and per video, a random point in each of the
evenly spaced bins in training, the bin centre in evaluation).

Batches pack variable lengths (see `collate`): videos and paragraphs are padded
to the batch's longest, and the clips / sentences of all videos of the batch
are stacked into one flat array, as the official collate does, so compute
follows the real clip count rather than the longest video's. Each padded axis
is rounded up to a multiple (`data.pad_multiple`, `data.clip_pad_multiple`),
so a run compiles a handful of shapes; with `data.static_shapes` every axis is
at its maximum (`batch_spec`) and a run compiles one program (the paper
configs: TPUs). A slot index (video row * N + position) tells the model where
each clip belongs.

With `data.pack_sequences` (the configs' default) each of the four local inputs
(clips, sentences, videos, paragraphs) is then packed several sequences to a row
(`array_store.pack`, first-fit decreasing into rows of the same padded length; the
packed row count rounded up to `pad_multiple`, or one row per sequence with
static shapes or several processes): `<input>` and `<input>_mask` hold the rows,
`<input>_segment` / `_position` / `_unpack` say where each sequence lies
(`coot_model.Packing`). The model computes the same function (attention within a
sequence, positions restarting per sequence, Attention-FA per sequence; only the
dropout masks differ), and the local transformers stop computing padding: on the
benchmark batch (`benchmarks/speed/coot_train_step.py`, clips of 10-80 frames padded
to 80) 128 clip rows instead of 256.

Loss, eq. 9 with the official weights (`config.loss`):
  L = w_H L^H_align + w_L L^L_align + w_g L^g_align + w_Hc L^H_cluster
      + w_Lc L^L_cluster [+ w_gc L^g_cluster] + lambda L_CMC
on L2-normalised embeddings (`avtext.losses.coot`), margin 0.2; the cycle
consistency works on the un-normalised clip / sentence embeddings and samples
one clip and one sentence per video (official `num_samples=1`). The official
trainer weighs the context-clustering term with the *low-level* clustering
weight whenever its own weight is non-zero (`trainer_retrieval.py`);
`loss.official_context_cluster_weight=True` (default) reproduces that,
False uses `loss.weight_context_cluster` itself. The paper configs set that
term's weight to 0, so both give the same paper runs.

Evaluation is the `hierarchical` evaluator over the predict functions
`embed_video` and `embed_text` (one row per video).
"""
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import builders
from avtext.data import array_store
from avtext.data import pipelines
from avtext.data import video as video_lib
from avtext.losses import coot as coot_losses
from avtext.models import coot as coot_model
from avtext.tasks import task_registry


# Most tokens of a paragraph: `coot_text.encode_paragraphs` (avtext.features.coot_text)
# cuts longer ones to its max_len, 512 (BERT's positions). No config field bounds it.
MAX_PARAGRAPH_TOKENS = 512


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def _padded(n: int, multiple: int) -> int:
  """`array_store.collate`'s padded length of a batch whose longest row has n."""
  return max(1, -(-n // multiple)) * multiple


@task_registry.register("coot")
class CootTask(task_registry.Task):
  """COOT on a `features` source with the COOT layout (`config.model.name = "coot"`)."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.max_clips = int(config.model.max_clips)
    # A sentence's tokens: at most the paragraph's, or data.max_sentence_tokens (the
    # static shape of data.static_shapes).
    self.max_sentence_tokens = int(config.data.get("max_sentence_tokens") or
                                   MAX_PARAGRAPH_TOKENS)

  # ---------------------------------------------------------------- data
  def check_source(self, source):
    if source.kind != builders.FEATURES or not hasattr(source, "keys"):
      raise ValueError(f"task 'coot' reads the COOT feature layout (config.dataset.name='coot'), "
                       f"got dataset {self.config.dataset.name!r} of kind {source.kind!r}")
    return source

  def num_train_examples(self) -> int:
    return len(self.train_source)

  def example(self, item: dict, rng: np.random.Generator | None) -> dict:
    """Frames sampled as the official `RetrievalDataset.__getitem__` (no augmentation)."""
    max_frames = int(self.config.data.max_frames)
    video = item["video"]
    n = min(len(video), max_frames)
    frames = video[video_lib.coot_frame_indices(len(video), n, rng)]
    clips, clip_lengths = [], []
    for start, num in item["segments"]:
      n = min(int(num), max_frames)
      clips.append(video[int(start) + video_lib.coot_frame_indices(int(num), n, rng)])
      clip_lengths.append(n)
    if len(clips) > self.max_clips:
      raise ValueError(f"video {item['id']!r} has {len(clips)} segments, more than "
                       f"config.model.max_clips={self.max_clips}; raise it")
    sentence_lengths = np.asarray(item["sentence_lengths"], np.int32)
    if len(sentence_lengths) != len(clips):
      raise ValueError(f"video {item['id']!r}: {len(clips)} segments but "
                       f"{len(sentence_lengths)} sentences")
    return {
        "video": np.asarray(frames, np.float32),
        "clip_frames": np.concatenate(clips).astype(np.float32),
        "clip_lengths": np.asarray(clip_lengths, np.int32),
        "paragraph": np.asarray(item["text"], np.float32),
        "sentence_lengths": sentence_lengths,
        "id": item["id"],
    }

  def collate(self, examples: list[dict]) -> dict:
    """Packs examples (see the module docstring) with the one `array_store.collate`."""
    data = self.config.data
    mult = int(data.get("pad_multiple", 8))
    n_max = self.max_clips
    rows = []  # one per clip (= sentence) of the batch
    for row, ex in enumerate(examples):
      clips = np.split(ex["clip_frames"], np.cumsum(ex["clip_lengths"])[:-1])
      sentences = np.split(ex["paragraph"], np.cumsum(ex["sentence_lengths"])[:-1])
      rows += [{"clips": c, "sentences": t, "clip_slot": np.int32(row * n_max + k)}
               for k, (c, t) in enumerate(zip(clips, sentences))]
    static = bool(data.get("static_shapes", False))
    num = _round_up((n_max if static else 1) * (len(examples) if static else len(rows)),
                    int(data.get("clip_pad_multiple", 32)))
    if data.get("max_clips_per_batch"):
      num = int(data.max_clips_per_batch)
      if len(rows) > num:
        raise ValueError(f"a batch holds {len(rows)} clips, more than "
                         f"config.data.max_clips_per_batch={num}")
    empty = {"clips": rows[0]["clips"][:0], "sentences": rows[0]["sentences"][:0],
             "clip_slot": np.int32(-1)}
    # data.static_shapes: every axis at its maximum (`batch_spec`), one program per run
    # (TPUs); else the batch's longest, rounded up to pad_multiple (a few programs).
    frames = _padded(int(data.max_frames), mult) if static else None
    tokens = _padded(MAX_PARAGRAPH_TOKENS, mult) if static else None
    sentence_tokens = _padded(self.max_sentence_tokens, mult) if static else None
    if static:
      longest = max(len(r["sentences"]) for r in rows)
      if longest > sentence_tokens:
        raise ValueError(f"a sentence of {longest} tokens is longer than "
                         f"config.data.max_sentence_tokens={self.max_sentence_tokens} "
                         "(data.static_shapes pads every sentence to it); raise it")
    batch = array_store.collate(rows + [empty] * (num - len(rows)),
                             max_len={"clips": frames, "sentences": sentence_tokens},
                             pad_multiple=mult)
    batch.update(array_store.collate(examples, keys=("video", "paragraph"),
                                  max_len={"video": frames, "paragraph": tokens},
                                  pad_multiple=mult))
    if data.get("pack_sequences", False):
      # Fixed row counts where shapes are fixed (static, or several processes: their
      # rows are concatenated), else the rows used rounded up to pad_multiple.
      # data.max_clips_per_batch fixes the clip and sentence rows the same way.
      fixed = static or jax.process_count() > 1
      for key in coot_model.PACKED:
        keep = fixed or (key in ("clips", "sentences") and data.get("max_clips_per_batch"))
        p = array_store.pack(batch[key], batch[f"{key}_mask"],
                          rows=len(batch[key]) if keep else None, row_multiple=mult)
        batch[key], batch[f"{key}_mask"] = p["packed"], p["packed_mask"]
        for field in coot_model.Packing._fields:
          batch[f"{key}_{field}"] = p[field]
    return batch

  def train_data(self, *, batch_size, seed, process_index, process_count):
    source = self.train_source
    return pipelines.train_batches(
        len(source), lambda i, rng: self.example(source[i], rng), batch_size=batch_size,
        seed=seed, process_index=process_index, process_count=process_count,
        collate=self.collate)

  def eval_examples(self, source):
    source = self.check_source(source)
    return lambda i: self.example(source[i], None)

  # ---------------------------------------------------------------- abstract shapes
  def example_spec(self, *, train: bool):
    """`example`'s arrays at their largest (train and eval alike; every leading axis
    varies per video today): video float32 [max_frames, video_dim], clip_frames
    [max_clips * max_frames, video_dim] (the clips' frames, concatenated), clip_lengths
    and sentence_lengths int32 [max_clips], paragraph float32 [MAX_PARAGRAPH_TOKENS,
    text_dim]. Batches are not stacked examples: see `batch_spec`."""
    del train
    frames, n = int(self.config.data.max_frames), self.max_clips
    video_dim, text_dim = int(self.config.model.video_dim), int(self.config.model.text_dim)
    return {"video": task_registry.spec((frames, video_dim), "float32"),
            "clip_frames": task_registry.spec((n * frames, video_dim), "float32"),
            "clip_lengths": task_registry.spec((n,), "int32"),
            "paragraph": task_registry.spec((MAX_PARAGRAPH_TOKENS, text_dim), "float32"),
            "sentence_lengths": task_registry.spec((n,), "int32")}

  def batch_spec(self, batch_size: int, *, train: bool, predict_fn: str | None = None,
                 process_count: int = 1):
    """The largest batch `collate` builds (loss_fn and all three predict fns read it).

    Data-dependent today: `collate` pads video / clips to the batch's longest (at most
    max_frames) and paragraph / sentences to its longest (at most MAX_PARAGRAPH_TOKENS),
    each rounded up to data.pad_multiple, and packs the C clips of the batch into
    round_up(C, data.clip_pad_multiple) rows unless data.max_clips_per_batch fixes
    them. Here every axis is its maximum: rows = max_clips_per_batch, else
    round_up(max_clips * batch_size / process_count, clip_pad_multiple), per process.
    """
    del train, predict_fn
    if batch_size % process_count:
      raise ValueError(f"batch_size={batch_size} is not a multiple of "
                       f"process_count={process_count}")
    d = self.config.data
    mult = int(d.get("pad_multiple", 8))
    if d.get("max_clips_per_batch"):
      rows = int(d.max_clips_per_batch)
    else:
      rows = _round_up(self.max_clips * batch_size // process_count,
                       int(d.get("clip_pad_multiple", 32)))
    rows *= process_count
    frames = _padded(int(d.max_frames), mult)
    tokens = _padded(MAX_PARAGRAPH_TOKENS, mult)
    sentence_tokens = _padded(self.max_sentence_tokens, mult)
    video_dim, text_dim = int(self.config.model.video_dim), int(self.config.model.text_dim)
    spec = task_registry.spec
    packed = {}
    if d.get("pack_sequences", False):  # packed rows: at most one per sequence
      for key, n, length in (("clips", rows, frames), ("sentences", rows, sentence_tokens),
                             ("video", batch_size, frames), ("paragraph", batch_size, tokens)):
        packed.update({f"{key}_{field}": spec((n, length), "int32")
                       for field in coot_model.Packing._fields})
    return packed | {"clips": spec((rows, frames, video_dim), "float32"),
            "clips_mask": spec((rows, frames), "bool"),
            "sentences": spec((rows, sentence_tokens, text_dim), "float32"),
            "sentences_mask": spec((rows, sentence_tokens), "bool"),
            "clip_slot": spec((rows,), "int32"),
            "video": spec((batch_size, frames, video_dim), "float32"),
            "video_mask": spec((batch_size, frames), "bool"),
            "paragraph": spec((batch_size, tokens, text_dim), "float32"),
            "paragraph_mask": spec((batch_size, tokens), "bool")}

  # ---------------------------------------------------------------- model
  def _global_slots(self, batch) -> jax.Array:
    """Slots of the global batch: process p's rows follow those of processes < p."""
    slot = batch["clip_slot"]
    procs = jax.process_count()
    if procs == 1:
      return slot
    per_proc_clips = slot.shape[0] // procs
    per_proc_videos = batch["video"].shape[0] // procs
    offset = (jnp.arange(slot.shape[0]) // per_proc_clips) * per_proc_videos * self.max_clips
    return jnp.where(slot >= 0, slot + offset, -1)

  def _packing(self, batch) -> dict:
    """{input: `coot_model.Packing`} of the inputs `collate` packed (data.pack_sequences);
    with several processes each one's unpack indices are offset past the rows of those
    before it (every process packs into the same number of rows)."""
    out = {}
    procs = jax.process_count()
    for key in coot_model.PACKED:
      if f"{key}_unpack" not in batch:
        continue
      unpack = batch[f"{key}_unpack"]
      if procs > 1:
        rows, length = batch[key].shape[:2]
        per_proc = unpack.shape[0] // procs
        offset = (jnp.arange(unpack.shape[0]) // per_proc) * (rows // procs) * length
        unpack = jnp.where(unpack >= 0, unpack + offset[:, None], -1)
      out[key] = coot_model.Packing(batch[f"{key}_segment"], batch[f"{key}_position"], unpack)
    return out

  def _encode(self, variables, batch, *, train: bool, rng=None):
    slot = self._global_slots(batch)
    rngs = {"dropout": rng} if train else None
    return self.model.apply(
        variables, batch["video"], batch["video_mask"], batch["clips"], batch["clips_mask"], slot,
        batch["paragraph"], batch["paragraph_mask"], batch["sentences"], batch["sentences_mask"],
        slot, deterministic=not train, rngs=rngs, packing=self._packing(batch))

  def init_variables(self, rng, batch):
    return self.model.init(
        {"params": rng}, batch["video"], batch["video_mask"], batch["clips"], batch["clips_mask"],
        batch["clip_slot"], batch["paragraph"], batch["paragraph_mask"], batch["sentences"],
        batch["sentences_mask"], batch["clip_slot"], packing=self._packing(batch))

  def loss_fn(self, variables, batch, rng):
    dropout_rng, cycle_rng = jax.random.split(rng)
    video, text = self._encode(variables, batch, train=True, rng=dropout_rng)
    return self.loss(video, text, cycle_rng)

  def loss(self, video: dict, text: dict, cycle_rng) -> tuple[Any, dict, dict]:
    """Eq. 9 on the model's outputs (see the module docstring)."""
    cfg = self.config.loss
    clip_mask = video["clip_mask"]
    use_context = bool(self.config.model.get("use_context", True))
    metrics = {}
    total, terms = coot_losses.hierarchical_alignment(
        video["video_emb"], text["paragraph_emb"], video["video_context"],
        text["paragraph_context"], video["clip_emb"], text["sentence_emb"], clip_mask,
        margin=cfg.margin, weight_high=cfg.weight_high, weight_low=cfg.weight_low,
        weight_context=cfg.weight_context if use_context else 0.0,
        weight_high_cluster=cfg.weight_high_cluster,
        weight_low_cluster=cfg.weight_low_cluster)
    metrics.update(terms)
    context_cluster = cfg.get("weight_context_cluster", 0.0)
    if context_cluster:
      weight = (cfg.weight_low_cluster if cfg.get("official_context_cluster_weight", True)
                else context_cluster)
      term = coot_losses.clustering(video["video_context"], text["paragraph_context"],
                                    margin=cfg.margin)
      metrics["cluster_context"] = term
      total = total + weight * term
    if cfg.cycle_weight:
      samples = cfg.get("cycle_samples", 1)
      cmc = coot_losses.cycle_consistency(
          video["clip_emb"], clip_mask, text["sentence_emb"], text["sentence_mask"],
          rng=cycle_rng if samples == 1 else None)
      metrics["cycle"] = cmc
      total = total + cfg.cycle_weight * cmc
    return total, metrics, {}

  def predict_fns(self):
    def embed(variables, batch):
      video, text = self._encode(variables, batch, train=False)
      return {"video_emb": video["video_emb"], "clip_emb": video["clip_emb"],
              "clip_mask": video["clip_mask"], "paragraph_emb": text["paragraph_emb"],
              "sentence_emb": text["sentence_emb"], "sentence_mask": text["sentence_mask"]}

    def embed_video(variables, batch):
      out = embed(variables, batch)
      return {k: out[k] for k in ("video_emb", "clip_emb", "clip_mask")}

    def embed_text(variables, batch):
      out = embed(variables, batch)
      return {k: out[k] for k in ("paragraph_emb", "sentence_emb", "sentence_mask")}

    return {"embed": embed, "embed_video": embed_video, "embed_text": embed_text}

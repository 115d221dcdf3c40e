"""Task `moments`: video corpus moment retrieval with XML (TVR sec. 4.3) on a `tvr` dataset.

Training example (one query): its token features cut to `model.max_query_len`
tokens, its video's clip features (video and / or subtitle streams, as
`model.context`) cut to `model.max_ctx_len` clips (the official truncation:
later moments become unreachable), both zero-padded with masks, and the
ground-truth clip labels

    start = min(floor(t_st / cl), n - 1),   end = min(max(ceil(t_ed / cl) - 1, start), n - 1)

with `end` inclusive, so decoding's (end + 1) * cl gives the moment back. (The
official code labels end = ceil(t_ed / cl), one clip past the moment, and decodes
it as inclusive, so its predictions run one clip long; `data.end_label =
"official"` reproduces that.)

Loss (eqs. 5, 6): L_vr on the batch's [B, B] VR scores with one negative video
and one negative query per positive (uniform over the batch, or from epoch
`loss.hard_negatives_from_epoch` uniform among the `loss.hard_pool_size`
highest-scoring ones) + `loss.span_weight` * L_svmr (with `model.span_head="sliding"`,
the Fig. 6 baseline, a per-clip BCE in place of L_svmr). Batches carry their epoch
(`epoch`, from the position in the training stream) for that switch.

Evaluation (`avtext.evals.vcmr`) encodes the split's video corpus with
`predict_fns()["encode_context"]` over `corpus_examples`, its queries with
`encode_query` over `eval_examples`, and ranks moments with `span_logits`
(`avtext.inference.vcmr`). `encode_text` encodes free-text queries as the dataset's
query features were written (`avtext.features.tvr_text`), then with `encode_query`:
what `avtext.search_moments` searches a stored corpus with.
"""
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import pipelines
from avtext.data.builders import tvr
from avtext.losses import xml as xml_losses
from avtext.models import xml as xml_lib
from avtext.tasks import task_registry
from avtext.weights import bert_encoder


def clip_labels(ts, num_clips: int, clip_length: float, end_label: str = "inclusive"
                ) -> tuple[int, int]:
  """(start, end) clip indices of a [t_st, t_ed] moment (module docstring)."""
  if end_label not in ("inclusive", "official"):
    raise ValueError(f"config.data.end_label={end_label!r}; expected 'inclusive' or 'official'")
  st = min(int(math.floor(ts[0] / clip_length)), num_clips - 1)
  if end_label == "official":
    ed = int(math.ceil(ts[1] / clip_length))
  else:
    ed = max(int(math.ceil(ts[1] / clip_length)) - 1, st)
  return st, min(ed, num_clips - 1)


def pad_rows(x: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
  """(x cut / zero-padded to `length` rows, int32 mask)."""
  x = x[:length]
  out = np.zeros((length,) + x.shape[1:], np.float32)
  out[:len(x)] = x
  mask = np.zeros(length, np.int32)
  mask[:len(x)] = 1
  return out, mask


@task_registry.register("moments")
class XMLTask(task_registry.Task):
  """XML on TVR-layout data (module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    m = config.model
    self.streams = xml_lib.modalities(m.get("context") or "video_sub")
    self.max_ctx_len = int(m.get("max_ctx_len") or 100)
    self.max_query_len = int(m.get("max_query_len") or 30)
    self.end_label = config.get("data", {}).get("end_label", "inclusive")
    clip_labels((0.0, 1.0), 1, 1.0, self.end_label)  # validates end_label
    loss = config.loss
    self.margin = float(loss.get("margin", 0.1))
    self.span_weight = float(loss.get("span_weight", 0.01))
    self.hard_from = loss.get("hard_negatives_from_epoch")
    self.hard_pool = int(loss.get("hard_pool_size") or 20)
    self._text_encoder = None

  # ---------------------------------------------------------------- data
  def check_source(self, source):
    if not hasattr(source, "context") or not hasattr(source, "corpus"):
      raise ValueError(f"task 'moments' reads TVR queries and their corpus (config.dataset."
                       f"name='tvr'), got {type(source).__name__} from dataset "
                       f"{self.config.dataset.name!r}")
    if "sub" in self.streams and source.sub_h5 is None:
      raise ValueError(f"config.model.context={self.config.model.context!r} needs subtitle "
                       f"features but config.dataset.sub_features is unset ({source!r})")
    return source

  def num_train_examples(self) -> int:
    return len(self.train_source)

  def context_example(self, ctx: dict) -> dict:
    """{"video"?, "sub"?: [max_ctx_len, D], "ctx_mask": [max_ctx_len]} of a video."""
    out = {}
    for m in self.streams:
      out[m], mask = pad_rows(ctx[m], self.max_ctx_len)
    out["ctx_mask"] = mask
    return out

  def query_example(self, item: dict) -> dict:
    query, mask = pad_rows(item["query"], self.max_query_len)
    return {"query": query, "query_mask": mask}

  def _train_example(self, source, i: int, rng) -> dict:
    del rng  # no augmentation (official)
    item = source[i]
    ctx = self.context_example(source.context(item["vid_name"]))
    n = int(ctx["ctx_mask"].sum())
    st, ed = clip_labels(item["ts"], n, source.clip_length, self.end_label)
    return {**self.query_example(item), **ctx, "start": np.int32(st), "end": np.int32(ed)}

  def train_data(self, *, batch_size, seed, process_index, process_count):
    source = self.train_source
    if not source.has_ground_truth:
      raise ValueError(f"{source!r}: training queries need vid_name and ts")
    n = len(source)
    batches = pipelines.train_batches(
        n, lambda i, rng: self._train_example(source, i, rng), batch_size=batch_size,
        seed=seed, process_index=process_index, process_count=process_count)
    global_batch = batch_size * process_count

    def with_epoch(k, batch):  # local batch k is global batch k (pipelines.train_batches)
      return {**batch, "epoch": np.full(len(batch["start"]), k * global_batch // n, np.int32)}
    return batches.map_with_index(with_epoch)

  def eval_examples(self, source) -> Callable[[int], dict]:
    source = self.check_source(source)

    def example(i: int) -> dict:
      item = source[i]
      return {**self.query_example(item), "desc_id": str(item["desc_id"]),
              "desc": item["desc"], "type": item["type"], "vid_name": item["vid_name"] or ""}
    return example

  def corpus_examples(self, source) -> Callable[[int], dict]:
    """`index -> example` over `source.corpus` (the split's videos, in order)."""
    source = self.check_source(source)

    def example(i: int) -> dict:
      vid, idx = source.corpus[i]
      return {**self.context_example(source.context(vid)), "vid_name": vid,
              "video_idx": str(idx)}
    return example

  def _feature_dim(self, key: str) -> int:
    dim = self.config.dataset.get(key)
    if not dim:
      raise ValueError(f"config.dataset.{key} is unset; example_spec reads no feature file, "
                       "so the feature widths must be in the config")
    return int(dim)

  def example_spec(self, *, train: bool):
    """Per-example shapes; every length is the model's maximum (the pipeline cuts and
    zero-pads to it: `pad_rows`), widths from config.dataset.{query,video,sub}_dim.

    train: query float32 [max_query_len, query_dim], query_mask int32 [max_query_len],
      `context_example` ('video' [max_ctx_len, video_dim] and / or 'sub' [max_ctx_len,
      sub_dim] float32 per `model.context`, ctx_mask int32 [max_ctx_len]), start, end
      int32 [] (clip labels) and epoch int32 [] (added per row by `train_data`).
    eval: keyed by predict-fn name, since the moments evaluator feeds each a different
      batch: encode_query the query fields (`eval_examples`), encode_context the
      context fields (`corpus_examples`), span_logits one (query, video) pair of the
      encoded outputs, q float32 [M, hidden_size] (M = the context streams), h1
      float32 [M, max_ctx_len, hidden_size] and mask uint8 [max_ctx_len], the corpus
      store's dtype (`vcmr.search` calls it with leading [Q, N] axes; they broadcast).
    """
    lq, lc = self.max_query_len, self.max_ctx_len
    query = {"query": task_registry.spec((lq, self._feature_dim("query_dim")), "float32"),
             "query_mask": task_registry.spec((lq,), "int32")}
    ctx = {m: task_registry.spec((lc, self._feature_dim(f"{m}_dim")), "float32")
           for m in self.streams}
    ctx["ctx_mask"] = task_registry.spec((lc,), "int32")
    if train:
      return {**query, **ctx,
              **{k: task_registry.spec((), "int32") for k in ("start", "end", "epoch")}}
    m, hidden = len(self.streams), int(self.model.hidden_size)
    return {"encode_query": query, "encode_context": ctx,
            "span_logits": {"q": task_registry.spec((m, hidden), "float32"),
                            "h1": task_registry.spec((m, lc, hidden), "float32"),
                            "mask": task_registry.spec((lc,), "uint8")}}

  def text_encoder(self) -> bert_encoder.TextEncoder:
    """The BERT that wrote the query features, loaded on first use:
    `config.dataset.query_encoder` (bert_dir, default the offline MiniLM-L6; layer, the
    hidden state, default -2)."""
    if self._text_encoder is None:
      enc = dict(self.config.dataset.get("query_encoder") or {})
      layer = enc.get("layer")
      self._text_encoder = bert_encoder.TextEncoder(enc.get("bert_dir"),
                                                    (-2 if layer is None else layer,))
    return self._text_encoder

  def text_query_examples(self, texts) -> tuple[dict, np.ndarray, np.ndarray]:
    """(query batch of `texts`, wordpieces per text, wordpieces the model sees per text):
    token features as `avtext.features.tvr_text` writes them (`tvr.MAX_QUERY_TOKENS`),
    L2-normalized as the `tvr` source reads them (`dataset.normalize_text`), cut and
    padded as `query_example`."""
    encoder = self.text_encoder()
    feats = encoder.token_features({str(i): t for i, t in enumerate(texts)},
                                   tvr.MAX_QUERY_TOKENS, desc="queries")
    normalize = bool(self.config.dataset.get("normalize_text", True))
    rows = [self.query_example({"query": tvr.l2_normalize(feats[str(i)]) if normalize
                                else feats[str(i)]}) for i in range(len(texts))]
    batch = {k: np.stack([r[k] for r in rows]) for k in ("query", "query_mask")}
    tokens = np.asarray([len(encoder.tokenizer.wordpiece(t)) for t in texts], np.int64)
    fits = max(0, min(tvr.MAX_QUERY_TOKENS, encoder.max_len) - 2)
    return batch, tokens, np.minimum(tokens, min(fits, self.max_query_len))

  # ---------------------------------------------------------------- model
  def _ctx(self, batch) -> dict:
    return {m: batch[m] for m in self.streams}

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, batch["query"], batch["query_mask"],
                           self._ctx(batch), batch["ctx_mask"])

  def loss_fn(self, variables, batch, rng) -> tuple[Any, dict, dict]:
    dropout_rng, neg_rng = jax.random.split(rng)
    out = self.model.apply(variables, batch["query"], batch["query_mask"], self._ctx(batch),
                           batch["ctx_mask"], train=True, rngs={"dropout": dropout_rng})
    scores = out["vr_scores"]
    neg_v, neg_q = xml_losses.sample_negatives(neg_rng, scores)
    hard = jnp.zeros((), bool)
    if self.hard_from is not None:
      hard = batch["epoch"][0] >= int(self.hard_from)
      hard_v, hard_q = xml_losses.sample_negatives(neg_rng, scores,
                                                      hard_pool_size=self.hard_pool)
      neg_v, neg_q = jnp.where(hard, hard_v, neg_v), jnp.where(hard, hard_q, neg_q)
    vr_loss = xml_losses.video_retrieval_hinge(scores, neg_v, neg_q, margin=self.margin)
    if "clip" in out:  # sliding-window baseline: BCE of every real clip, inside = 1
      span_loss = xml_losses.clip_bce(out["clip"], batch["start"], batch["end"],
                                      batch["ctx_mask"])
    else:
      span_loss = xml_losses.svmr_nll(out["start"], out["end"], batch["start"], batch["end"],
                                         batch["ctx_mask"])
    loss = vr_loss + self.span_weight * span_loss
    pos = jnp.diagonal(scores)
    return loss, {"vr_loss": vr_loss, "span_loss": span_loss,
                  "hard_negatives": hard.astype(jnp.float32),
                  "positive_score": jnp.mean(pos)}, {}

  def predict_fns(self):
    model = self.model

    def encode_query(variables, batch):
      return {"q": model.apply(variables, batch["query"], batch["query_mask"],
                               method=model.encode_query)}

    def encode_context(variables, batch):
      h0, h1 = model.apply(variables, self._ctx(batch), batch["ctx_mask"],
                           method=model.encode_context)
      return {"h0": h0, "h1": h1, "mask": batch["ctx_mask"]}

    def span_logits(variables, batch):
      return model.apply(variables, batch["q"], batch["h1"], batch["mask"],
                         method=model.span_logits)

    jitted_query = jax.jit(encode_query)

    def encode_text(variables, batch):
      """{"text": [Q] str} -> {"q": [Q, M, hidden_size], "tokens": [Q] wordpieces per text,
      "kept": [Q] the ones encoded}; runs BERT on the host (`text_query_examples`), so
      it is called as is, never under jit."""
      queries, tokens, kept = self.text_query_examples(batch["text"])
      q = np.asarray(jitted_query(variables, queries)["q"])
      return {"q": q, "tokens": tokens, "kept": kept}

    return {"encode_query": encode_query, "encode_context": encode_context,
            "span_logits": span_logits, "encode_text": encode_text}

"""TVC captioning with MMT (TVR app. D.2): a moment's clip features and subtitle words ->
a caption (`config.task = "captioning"`, `config.model.name = "mmt"`, dataset `tvc`).

The `captioning` task name picks this class for `config.model.name = "mmt"`
(`avtext/tasks/captioning.py`), so configs/mmt_tvc.py and existing run directories
keep their `task`.

Training: teacher forcing on every (moment, description) pair with the loss
`config.loss.name` names (`avtext.losses.captioning`: "kl_sum", the official
TVCaption loss, by default; "nll" ours). Prediction: `captions` decodes with
`avtext.inference.generate` (`config.generation`; `banned_ids` default [UNK]);
evaluation is the `captioning` evaluator (`avtext/evals/captioning.py`).
"""
import ml_collections
import numpy as np

from avtext import errors
from avtext.data import pipelines
from avtext.data.builders import tvc
from avtext.inference import generate
from avtext.losses import captioning as caption_losses
from avtext.models import mmt as mmt_lib
from avtext.tasks import task_registry
from avtext.text import vocab as vocab_lib

CONTEXTS = ("video_sub", "video", "sub")


def moment_clips(ts, num_clips: int, clip_length: float = tvc.CLIP_LENGTH) -> tuple[int, int]:
  """(st, ed) clip indices of a moment, ed inclusive: floor(ts0 / cl), ceil(ts1 / cl)."""
  return int(np.floor(ts[0] / clip_length)), int(np.ceil(ts[1] / clip_length))


def video_rows(st: int, ed: int, num_clips: int, max_clips: int) -> np.ndarray:
  """The feature rows of clips st..ed (TVCaption `_load_indexed_video_feature`).

  ed is clamped to the last clip (st moved to ed - 1 if it passes it); more
  than `max_clips` clips are sampled with linspace(st, ed, max_clips) floored.
  """
  ed = min(ed, num_clips - 1)
  if st > ed:
    st = max(0, ed - 1)
  if ed - st + 1 > max_clips:
    return np.linspace(st, ed, max_clips, endpoint=True).astype(np.int64)
  return np.arange(st, ed + 1)


def moment_subtitle(subtitles, st: int, ed: int,
                    clip_length: float = tvc.CLIP_LENGTH) -> str:
  """The lines touching clips st..ed (a line covers clips floor(start / cl) .. ceil(end / cl)
  exclusive, TVCaption `process_single_vid_sub`), joined with spaces in file order."""
  picked = []
  for start, end, text in subtitles:
    a, b = int(np.floor(start / clip_length)), int(np.ceil(end / clip_length))
    if a < b and a <= ed and b - 1 >= st:
      picked.append(text)
  return " ".join(picked)


class MmtCaptioningTask(task_registry.Task):
  """TVC moment -> caption with MMT (`config.model.name = "mmt"`, dataset `tvc`).

  Context (avtext/models/mmt.py): the moment's clips ([CLS] [VID] x n [SEP],
  `data.max_v_len` positions, at most max_v_len - 2 clips) and subtitle words
  ([BOS] words [EOS], `data.max_sub_len`), by TVCaption's rules
  (`moment_clips`, `video_rows`, `moment_subtitle`); `data.context` =
  "video_sub" (default), "video" or "sub" (the paper's Table 14 ablation: the
  other part becomes 2 masked positions). Captions: `WordVocab`, [BOS] words
  [EOS] in `data.max_cap_len` positions. Training walks every (moment,
  description) pair; evaluation captions each moment once against all its
  descriptions.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    if not config.model.get("vocab"):  # the model alone can be sized by vocab_size
      raise errors.BadInput(
          "config.model.vocab is not set: the MMT task reads and writes captions through "
          "a word2idx JSON (TVCaption's tvc_word2idx.json, or python -m "
          "avtext.tools.caption_vocab); config.model.vocab_size only sizes the model")
    self.vocab = vocab_lib.WordVocab.load(config.model.vocab)
    if len(self.vocab) != self.model.vocab_size:
      raise ValueError(f"config.model.vocab has {len(self.vocab)} words but the model "
                       f"{self.model.vocab_size}; leave config.model.vocab_size None")
    d = config.data
    self.context = d.get("context", "video_sub")
    if self.context not in CONTEXTS:
      raise ValueError(f"config.data.context={self.context!r}; expected one of {CONTEXTS}")
    self.max_v_len = int(d.max_v_len) if "video" in self.context else 2
    self.max_sub_len = int(d.max_sub_len) if "sub" in self.context else 2
    self.max_cap_len = int(d.max_cap_len)
    if self.max_v_len + self.max_sub_len > self.model.max_positions:
      raise ValueError(f"max_v_len + max_sub_len = {self.max_v_len + self.max_sub_len} > "
                       f"config.model.max_positions={self.model.max_positions}")
    self._pairs = None
    self.token_loss = caption_losses.get(config.loss.get("name", "nll"))

  # ---------------------------------------------------------------- data
  def check_source(self, source):
    if not hasattr(source, "describe") or not hasattr(source, "video_dim"):
      raise ValueError(f"MMT captioning reads TVC moments (config.dataset.name='tvc'), got "
                       f"{type(source).__name__} from dataset {self.config.dataset.name!r}")
    if int(source.video_dim) != self.model.video_dim:
      raise ValueError(f"{source!r}: {source.video_dim}-d video features but "
                       f"config.model.video_dim={self.model.video_dim}")
    return source

  @property
  def pairs(self) -> list[tuple[int, int]]:
    """(moment, description) per training example (the official one per pair)."""
    if self._pairs is None:
      src = self.train_source
      self._pairs = [(i, j) for i in range(len(src)) for j in range(len(src.describe(i)["descs"]))]
      if not self._pairs:
        raise ValueError(f"{src!r}: no descriptions to train on")
    return self._pairs

  def num_train_examples(self) -> int:
    return len(self.pairs)

  def train_captions(self, n: int) -> list[str]:
    src = self.train_source
    return [src.describe(i)["descs"][j] for i, j in self.pairs[:n]]

  def context_example(self, item: dict) -> dict:
    """ctx_ids, video, ctx_mask, token_type_ids of a moment (`MmtCaptioningTask` doc)."""
    v_len, s_len = self.max_v_len, self.max_sub_len
    ids = np.zeros(v_len + s_len, np.int32)
    mask = np.zeros(v_len + s_len, np.int32)
    video = np.zeros((v_len + s_len, self.model.video_dim), np.float32)
    st, ed = moment_clips(item["ts"], len(item["video"]))
    if "video" in self.context:
      rows = video_rows(st, ed, len(item["video"]), v_len - 2)
      n = len(rows)
      ids[:n + 2] = [self.vocab.CLS] + [self.vocab.VID] * n + [self.vocab.SEP]
      mask[:n + 2] = 1
      video[1:n + 1] = item["video"][rows]
    if "sub" in self.context:
      sub_ids, sub_mask = self.vocab.encode(moment_subtitle(item["subtitles"], st, ed), s_len)
      ids[v_len:] = sub_ids
      mask[v_len:] = sub_mask
    types = np.concatenate([np.zeros(v_len, np.int32), np.ones(s_len, np.int32)])
    return {"ctx_ids": ids, "video": video, "ctx_mask": mask, "token_type_ids": types}

  def _train_example(self, k: int, rng) -> dict:
    del rng  # no augmentation (official)
    i, j = self.pairs[int(k)]
    item = self.train_source[i]
    return {**self.context_example(item),
            **self.vocab.caption(item["descs"][j], self.max_cap_len)}

  def train_data(self, *, batch_size, seed, process_index, process_count):
    self.train_source  # pylint: disable=pointless-statement  (opened before workers fork)
    return pipelines.train_batches(len(self.pairs), self._train_example, batch_size=batch_size,
                                   seed=seed, process_index=process_index,
                                   process_count=process_count)

  def eval_examples(self, source):
    source = self.check_source(source)  # a split without descriptions is captioned, not scored

    def example(i: int) -> dict:
      item = source[i]
      return {**self.context_example(item), "clip_id": str(item["id"]),
              "vid_name": item["vid_name"], "ts": list(item["ts"]),
              "references": list(item["descs"]), "attributes": item["attributes"]}
    return example

  def example_spec(self, *, train: bool):
    """The context (`context_example`) of N = max_v_len + max_sub_len positions (the
    context's missing part counts 2): ctx_ids, ctx_mask, token_type_ids int32 [N], video
    float32 [N, model.video_dim]; train adds the caption's input_ids / target_ids /
    target_mask int32 [max_cap_len - 1] (`WordVocab.caption`). Every length is fixed."""
    n = self.max_v_len + self.max_sub_len
    out = {"ctx_ids": task_registry.spec((n,), "int32"),
           "video": task_registry.spec((n, self.model.video_dim), "float32"),
           "ctx_mask": task_registry.spec((n,), "int32"),
           "token_type_ids": task_registry.spec((n,), "int32")}
    if train:
      out.update({k: task_registry.spec((self.max_cap_len - 1,), "int32")
                  for k in ("input_ids", "target_ids", "target_mask")})
    return out

  # ---------------------------------------------------------------- model
  def _context(self, batch):
    return (batch["ctx_ids"], batch["video"], batch["ctx_mask"], batch["token_type_ids"])

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, *self._context(batch), batch["input_ids"])

  def loss_fn(self, variables, batch, rng):
    logits = self.model.apply(variables, *self._context(batch), batch["input_ids"], train=True,
                              rngs={"dropout": rng})
    return self.caption_loss(logits, batch)

  def caption_loss(self, logits, batch):
    """(loss, metrics, {}) of teacher-forced logits [B, L, V] (`config.loss.name`)."""
    eps = float(self.config.loss.get("label_smoothing", 0.0))
    return (*self.token_loss(logits, batch["target_ids"], batch["target_mask"], eps), {})

  def predict_fns(self):
    model, gen = self.model, self.config.generation
    max_new = int(gen.get("max_new_tokens") or self.max_cap_len - 1)
    banned = tuple(int(t) for t in gen.get("banned_ids", (self.vocab.UNK,)))

    def captions(variables, batch):
      ctx = dict(zip(("ctx_ids", "video", "ctx_mask", "token_type_ids"), self._context(batch)))
      start, step = mmt_lib.captioner_decoding_fns(model, variables, ctx, max_new,
                                                   bos_id=self.vocab.BOS, banned_ids=banned)
      return generate.from_config(gen, start, step, max_new_tokens=max_new,
                                  eos_id=self.vocab.EOS)

    return {"captions": captions}

  def decode(self, tokens: np.ndarray) -> list[str]:
    return [self.vocab.decode(row) for row in np.asarray(tokens)]

"""Video captioning (`config.task = "captioning"`): VideoCC's GPT-2 captioner (§4.2)
and TVC's MMT (TVR app. D.2), picked by `config.model.name`.

Training: teacher forcing on (clip, caption) pairs. `config.loss.name`:
  "nll": the negative log-likelihood of the caption's tokens and EOS (VideoCC §4.2:
    "We minimise the negative log-likelihood of generating the ground-truth
    caption"), averaged over the batch's real target tokens;
    `config.loss.label_smoothing` (0 for VideoCC) mixes the one-hot target with the
    uniform distribution, eps/V on every word (`sequence_nll`). The VideoCC
    captioner's loss, and MMT's with configs/mmt_tvc.py:mean_nll.
  "kl_sum" (MMT only, its default): the official TVCaption LabelSmoothingLoss
    (`tvc_label_smoothing_loss`): KL(q || p) with q = 1 - eps on the target word and
    eps / (V - 1) on each of the V - 1 others, SUMMED over the batch's real target
    tokens, as the official train.py optimizes it (its logged loss and perplexity
    are per word: the metric `loss_per_word`). With label_smoothing 0 the official
    code uses nn.CrossEntropyLoss, the mean over the real tokens, and so does this.
    Why ours ("nll") is kept: a mean does not scale the gradient with the batch's
    word count, so the learning rate and the gradient-clip norm (1.0) mean the same
    at any batch size; with the sum the official clip is active on nearly every
    step at batch 128.

Prediction: `generate` decodes captions with `avtext.inference.generate`
(`config.generation`: beam_size, max_new_tokens, min_length,
length_penalty), the whole loop jitted with the KV cache. Evaluation is the
`captioning` evaluator (`avtext/evals/captioning.py`).

The video encoder can start from an AVR run: both models name it `video/`,
so `config.init_from.params = (("video/", "video/"),)` carries it over.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from avtext.data import pipelines
from avtext.inference import generate
from avtext.modalities import parse_modalities
from avtext.models import gpt2 as gpt2_lib
from avtext.models import mmt as mmt_lib
from avtext.tasks import registry
from avtext.text import tokenizers
from avtext.text import vocab
from avtext.weights import gpt2 as gpt2_weights

HOST_FIELDS = ("caption", "attributes", "clip_id")


def caption_tokenizer(config: ml_collections.ConfigDict) -> tokenizers.CaptionTokenizer:
  """The decoder's tokenizer: GPT-2 BPE, with `config.model.decoder.vocab_subset` if set."""
  dec = config.model.decoder
  tok = tokenizers.CaptionTokenizer(config.data.get("bpe_dir"),
                                    max_len=config.data.max_caption_len,
                                    vocab_subset=dec.get("vocab_subset"))
  if dec.get("vocab_size") and dec.vocab_size != tok.vocab_size:
    raise ValueError(f"config.model.decoder.vocab_size={dec.vocab_size} but the tokenizer has "
                     f"{tok.vocab_size} tokens (vocab_subset={dec.get('vocab_subset')}); "
                     "leave vocab_size None to take it from the tokenizer")
  return tok


def sequence_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                 label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """(mean NLL over the real target tokens, token accuracy %): [B, L, V], [B, L], [B, L]."""
  v = logits.shape[-1]
  labels = optax.smooth_labels(jax.nn.one_hot(targets, v), label_smoothing) \
      if label_smoothing else jax.nn.one_hot(targets, v)
  nll = optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)
  mask = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  hits = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return jnp.sum(nll * mask) / count, 100.0 * jnp.sum(hits * mask) / count


def tvc_label_smoothing_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                             label_smoothing: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The official TVCaption caption loss (module docstring, "kl_sum").

  Args:
    logits: [B, L, V]; targets, mask: [B, L] (mask nonzero for real target tokens,
      the official labels other than -1).
    label_smoothing: eps in [0, 1].

  Returns:
    (loss, loss per real token, token accuracy %): with eps > 0 the loss is
    sum over real tokens of KL(q || softmax(logits)), q = 1 - eps on the target and
    eps / (V - 1) elsewhere (torch's F.kl_div(log_softmax, q, reduction="sum"), the
    entropy term of q included); with eps = 0 the mean cross-entropy
    (nn.CrossEntropyLoss(ignore_index=-1)).
  """
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"config.loss.label_smoothing={label_smoothing}; expected 0 <= eps <= 1")
  v = logits.shape[-1]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  mask = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  hits = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  accuracy = 100.0 * jnp.sum(hits * mask) / count
  if not label_smoothing:
    loss = -jnp.sum(target_logp * mask) / count
    return loss, loss, accuracy
  eps = float(label_smoothing)
  other = eps / (v - 1)
  conf = 1.0 - eps
  # sum_w q_w log q_w (0 log 0 = 0, as torch's kl_div), then the cross term.
  entropy = (conf * np.log(conf) if conf > 0 else 0.0) + eps * np.log(other)
  cross = conf * target_logp + other * (jnp.sum(logp, -1) - target_logp)
  loss = jnp.sum((entropy - cross) * mask)
  return loss, loss / count, accuracy


def generate_captions(gen: ml_collections.ConfigDict, start, step, max_new: int, eos: int):
  """`config.generation` (beam_size, min_length, length_penalty) applied to a decoder."""
  return generate.generate(start, step, max_new_tokens=max_new, eos_id=eos,
                           beam_size=int(gen.beam_size), min_length=int(gen.get("min_length", 0)),
                           length_penalty=float(gen.get("length_penalty", 0.0)))


@registry.register("captioning")
def captioning_task(config: ml_collections.ConfigDict):
  """The captioning task of `config.model.name`: VideoCC's captioner or TVC's MMT."""
  name = config.model.get("name")
  if name == "video_captioner":
    return CaptioningTask(config)
  if name == "mmt":
    return MmtCaptioningTask(config)
  raise ValueError(f"task 'captioning': config.model.name={name!r}; expected "
                   "'video_captioner' (VideoCC) or 'mmt' (TVC)")


class CaptioningTask(registry.ClipTask):
  """Clip -> caption (`config.model.name = "video_captioner"`)."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.tokenizer = caption_tokenizer(config)
    super().__init__(config)
    self.modalities = parse_modalities(config.model.video.modalities)
    if config.data.get("eval_num_clips", 1) != 1:
      raise ValueError(f"captioning: config.data.eval_num_clips="
                       f"{config.data.eval_num_clips}; a caption is generated from one "
                       "(centre) clip per video, set it to 1")

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data,
                                  self.tokenizer, train=train, modalities=self.modalities,
                                  host_fields=() if train else HOST_FIELDS)

  def example_spec(self, *, train: bool):
    """`clip_spec` (eval: K = eval_num_clips = 1 axis) + the caption's input_ids /
    target_ids / target_mask int32 [max_caption_len] (eval examples carry them too)."""
    n = self.config.data.max_caption_len
    return {**self.clip_spec(train=train),
            **{k: registry.spec((n,), "int32") for k in ("input_ids", "target_ids", "target_mask")}}

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, registry.video_inputs(batch), batch["input_ids"])

  def load_pretrained(self, params):
    weights = gpt2_weights.weights_dir(self.config.model.decoder.get("weights"))
    if weights is None:
      return params
    _, decoder = gpt2_weights.load_hf_gpt2(weights, self.tokenizer.gpt2_ids)
    expected = jax.tree.map(lambda x: (x.shape, x.dtype), params["decoder"])
    loaded = jax.tree.map(lambda x: (x.shape, x.dtype), decoder)
    if expected != loaded:
      raise ValueError(f"{weights}: the GPT-2 checkpoint does not match config.model.decoder "
                       "(compare its config.json)")
    return {**params, "decoder": decoder}

  def loss_fn(self, variables, batch, rng):
    logits = self.model.apply(variables, registry.video_inputs(batch), batch["input_ids"],
                              train=True, rngs={"dropout": rng})
    loss, accuracy = sequence_nll(logits, batch["target_ids"], batch["target_mask"],
                                  self.config.loss.get("label_smoothing", 0.0))
    return loss, {"token_accuracy": accuracy}, {}

  def predict_fns(self):
    model, gen = self.model, self.config.generation
    bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
    max_new = int(gen.max_new_tokens)

    def captions(variables, batch):  # {"tokens": [B, T], "lengths": [B], "scores": [B]}
      inputs = {k: v[:, 0] for k, v in registry.video_inputs(batch).items()}  # K = 1
      start, step = gpt2_lib.captioner_decoding_fns(model, variables, inputs, max_new, bos)
      return generate_captions(gen, start, step, max_new, eos)

    return {"captions": captions}

  def decode(self, tokens: np.ndarray) -> list[str]:
    return [self.tokenizer.decode(row) for row in np.asarray(tokens)]

  def train_captions(self, n: int) -> list[str]:
    """The first n training captions (the evaluator's most-frequent baseline)."""
    return pipelines.source_captions(self.train_source, n)


# ---------------------------------------------------------------------------- TVC / MMT

CONTEXTS = ("video_sub", "video", "sub")
MMT_LOSSES = ("kl_sum", "nll")  # the official TVCaption loss; ours (module docstring)
MMT_HOST_FIELDS = ("clip_id", "vid_name", "ts", "references", "attributes")


def moment_clips(ts, num_clips: int, clip_length: float = 1.5) -> tuple[int, int]:
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


def moment_subtitle(subtitles, st: int, ed: int, clip_length: float = 1.5) -> str:
  """The lines touching clips st..ed (a line covers clips floor(start / cl) .. ceil(end / cl)
  exclusive, TVCaption `process_single_vid_sub`), joined with spaces in file order."""
  picked = []
  for start, end, text in subtitles:
    a, b = int(np.floor(start / clip_length)), int(np.ceil(end / clip_length))
    if a < b and a <= ed and b - 1 >= st:
      picked.append(text)
  return " ".join(picked)


class MmtCaptioningTask(registry.Task):
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
    self.vocab = vocab.WordVocab.load(config.model.vocab)
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
    self.loss_name = config.loss.get("name", "nll")
    if self.loss_name not in MMT_LOSSES:
      raise ValueError(f"config.loss.name={self.loss_name!r}; MMT captioning expects one of "
                       f"{MMT_LOSSES} (avtext/tasks/captioning.py)")

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
    out = {"ctx_ids": registry.spec((n,), "int32"),
           "video": registry.spec((n, self.model.video_dim), "float32"),
           "ctx_mask": registry.spec((n,), "int32"),
           "token_type_ids": registry.spec((n,), "int32")}
    if train:
      out.update({k: registry.spec((self.max_cap_len - 1,), "int32")
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
    if self.loss_name == "kl_sum":
      loss, per_word, accuracy = tvc_label_smoothing_loss(
          logits, batch["target_ids"], batch["target_mask"], eps)
      return loss, {"token_accuracy": accuracy, "loss_per_word": per_word}, {}
    loss, accuracy = sequence_nll(logits, batch["target_ids"], batch["target_mask"], eps)
    return loss, {"token_accuracy": accuracy}, {}

  def predict_fns(self):
    model, gen = self.model, self.config.generation
    max_new = int(gen.get("max_new_tokens") or self.max_cap_len - 1)
    banned = tuple(int(t) for t in gen.get("banned_ids", (self.vocab.UNK,)))

    def captions(variables, batch):
      ctx = dict(zip(("ctx_ids", "video", "ctx_mask", "token_type_ids"), self._context(batch)))
      start, step = mmt_lib.captioner_decoding_fns(model, variables, ctx, max_new,
                                                   bos_id=self.vocab.BOS, banned_ids=banned)
      return generate_captions(gen, start, step, max_new, self.vocab.EOS)

    return {"captions": captions}

  def decode(self, tokens: np.ndarray) -> list[str]:
    return [self.vocab.decode(row) for row in np.asarray(tokens)]

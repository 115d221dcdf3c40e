"""Spoken Moments (S-MiT): video <-> language-caption / spoken-caption retrieval.

`config.task = "smit"`, `config.model.name = "smit"` (avtext/models/smit.py). A batch of
N (video, caption) pairs -> the two heads' outputs -> S = caption @ video.T over the
*global* batch (every device's captions are negatives for every video) -> the loss
`config.loss.name` names (`contrastive.SMIT_LOSSES`):

  amm               S-MiT eq. 2 + eq. 3, alpha = loss.alpha (0.5)     (the paper's)
  mms               eq. 2 with M = mms_margin(step): 0.001, x1.002 every 1000 steps
  nce               eq. 1 (the positive left out of the denominator)
  semi_hard_triplet SHN, margin loss.margin (1.0)

all with logits S / loss.temperature (1.0: the paper's dot product).

Inputs (`SMiTExamples`) come from either source kind:

  clips     (`synthetic_smit`, or a real S-MiT clips dataset) rendered/decoded frames:
            data.num_image_frames (3) at data.image_fps (1 fps) for the image
            backbone and data.num_temporal_frames (8) every data.temporal_stride
            frames (25 fps / 8 ~ 3 fps) for the temporal one, centred in the clip (a
            3 s clip is 75 frames: the paper's ~3 fps x 8 frames covers it); no visual
            augmentation (the paper names none, and phase 1 reads features computed
            once). Language: the ASR 'transcript' tokenized with word numbers.
            Spoken: the 'spoken_caption' waveform -> `audio.speech_features`.
  features  (`smit_features`, written by `python -m avtext.features smit`): the
            frozen backbones' 'image_embedding' / 'temporal_embedding', the frozen
            text encoder's per-word 'words' and the whole spoken caption's 'log_mel';
            exactly what the phase-1 model computes from clips, at a fraction of
            the cost.

Spoken captions: a random data.speech_crop_s (10 s) crop in training, the whole caption
(cut or padded to data.speech_frames) at test (S-MiT sec. 4.2.2).

Predict functions for the `retrieval` evaluator: `embed_text` (the caption model; the
evaluator's query side) and `embed_video`.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import audio
from avtext.data import builders
from avtext.data import video as video_lib
from avtext.losses import contrastive
from avtext.metrics import retrieval as retrieval_metrics
from avtext.tasks import task_registry
from avtext.weights import pretrained

SPEECH_FPS = 100  # log-mel frames per second (10 ms hop)


class SMiTExamples:
  """`(index[, rng]) -> example` of an S-MiT source (module docstring)."""

  def __init__(self, source, config: ml_collections.ConfigDict, tokenizer, *, train: bool):
    self.source, self.train = source, train
    self.data, self.model = config.data, config.model
    self.caption = config.model.get("caption", "language")
    self.tokenizer = tokenizer
    self.features = source.kind == builders.FEATURES
    self._lazy = hasattr(source, "describe") and hasattr(source, "render_frames")

  # ---- frames -------------------------------------------------------------

  def frame_indices(self, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """(image frame indices [num_image_frames], temporal ones [num_temporal_frames])."""
    d = self.data
    centres = (np.arange(d.num_image_frames) + 0.5) * d.fps / d.image_fps
    image = np.clip(np.round(centres), 0, num_frames - 1).astype(np.int64)
    temporal = video_lib.sample_frame_indices(num_frames, d.num_temporal_frames,
                                              d.temporal_stride, rng=None)
    return image, temporal

  def _frames(self, index: int, ex: dict | None) -> dict:
    d = self.data
    if ex is None:
      num_frames = self.source.describe(index)["num_frames"]
    else:
      num_frames = len(ex["frames"])
    image, temporal = self.frame_indices(num_frames)
    idx = np.concatenate([image, temporal])
    frames = (self.source.render_frames(index, idx) if ex is None
              else np.asarray(ex["frames"])[idx])
    frames = video_lib.resize_crop_normalize(frames, size=d.image_size, train=False)
    frames = frames.astype(np.float32)
    out = {}
    if self.model.video.get("image"):
      out["image_frames"] = frames[:len(image)]
    if self.model.video.get("temporal"):
      out["temporal_frames"] = frames[len(image):]
    return out

  # ---- captions -----------------------------------------------------------

  def _speech(self, mel: np.ndarray | None, wave: np.ndarray | None, rng) -> dict:
    d = self.data
    if wave is not None:
      spec, mask = audio.speech_features(
          wave, num_frames=d.speech_frames, crop_s=d.speech_crop_s if self.train else None,
          rng=rng, num_mel_bins=d.num_mel_bins)
      return {"log_mel": spec, "log_mel_mask": mask}
    mel = np.asarray(mel, np.float32)
    crop = int(round(d.speech_crop_s * SPEECH_FPS))
    if self.train and len(mel) > crop:
      start = int(rng.integers(0, len(mel) - crop + 1))
      mel = mel[start:start + crop]
    out, mask = audio.pad_log_mel(mel, d.speech_frames)
    return {"log_mel": out, "log_mel_mask": mask}

  def __call__(self, index: int, rng: np.random.Generator | None = None) -> dict:
    out: dict = {}
    if self.features:
      item = self.source[index]
      for key in ("image_embedding", "temporal_embedding"):
        if key in item:
          out[key] = np.asarray(item[key], np.float32)
      if self.caption == "language":
        words = np.asarray(item["words"], np.float32)[:self.model.max_words]
        padded = np.zeros((self.model.max_words, words.shape[1]), np.float32)
        padded[:len(words)] = words
        mask = np.zeros(self.model.max_words, bool)
        mask[:len(words)] = True
        out.update(words=padded, word_mask=mask)
      else:
        out.update(self._speech(item["log_mel"], None, rng))
      clip_id = item["id"]
    else:
      ex = None if self._lazy else self.source[index]
      out.update(self._frames(index, ex))
      desc = self.source.describe(index) if self._lazy else ex
      if self.caption == "language":
        tokens = self.tokenizer([str(desc["transcript"])], with_words=True)
        out.update({k: v[0] for k, v in tokens.items()})
      else:
        wave = self.source.render_speech(index) if self._lazy else ex["spoken_caption"]
        out.update(self._speech(None, np.asarray(wave, np.float32), rng))
      clip_id = desc.get("clip_id") or f"{index:08d}"
    if not self.train:
      out["clip_id"] = str(clip_id)
    return out


@task_registry.register("smit")
class SMiTTask(task_registry.ClipTask):
  """S-MiT video <-> caption retrieval (module docstring)."""

  loss_needs_step = True  # the MMS margin grows with the step

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.caption = config.model.get("caption", "language")
    self._widths = None  # `_feature_widths`, computed on first use
    self.sim_loss = contrastive.get_smit_loss(config.loss.name)
    self.tokenizer = pretrained.text_tokenizer(config) if self.caption == "language" else None

  def check_source(self, source):
    if source.kind == builders.FEATURES:
      need = {"language": "words", "spoken": "log_mel"}[self.caption]
      keys = set(getattr(source, "schema", {}))
      if keys and need not in keys:
        raise ValueError(f"task 'smit' ({self.caption} captions) needs '{need}' in the "
                         f"features dataset; it holds {sorted(keys)}")
      return source
    if source.kind != builders.CLIPS:
      raise ValueError(f"task 'smit' reads clips or features, got {source.kind!r}")
    return source

  def examples(self, source, *, train: bool) -> SMiTExamples:
    return SMiTExamples(source, self.config, self.tokenizer, train=train)

  def dummy_batch(self) -> dict:
    """One example of every input the model has, for `init_variables` (whatever the
    source kind: a phase-1 run on features still creates the backbones' and the text
    encoder's parameters, which phase 2 and `init_from` need)."""
    d = self.config.data
    s = d.image_size
    batch = {"image_frames": jnp.zeros((1, d.num_image_frames, s, s, 3)),
             "temporal_frames": jnp.zeros((1, d.num_temporal_frames, s, s, 3))}
    if self.caption == "language":
      n = d.max_text_len
      batch.update(input_ids=jnp.zeros((1, n), jnp.int32),
                   attention_mask=jnp.ones((1, n), jnp.int32),
                   word_index=jnp.zeros((1, n), jnp.int32))
    else:
      batch.update(log_mel=jnp.zeros((1, d.speech_frames, d.num_mel_bins)),
                   log_mel_mask=jnp.ones((1, d.speech_frames), jnp.int32))
    return batch

  def init_variables(self, rng, batch):
    del batch
    return self.model.init({"params": rng, "sample": rng, "dropout": rng}, self.dummy_batch(),
                           train=False)

  # Datasets of kind 'features' (`smit_features`); every other S-MiT dataset gives clips.
  FEATURE_DATASETS = ("smit_features",)

  def _feature_widths(self) -> dict[str, int]:
    """Widths of the phase-1 features: the frozen parts' outputs (what
    `avtext.features.smit` stores), by `jax.eval_shape` of the model (no weights)."""
    if self._widths is not None:
      return self._widths
    model = self.model

    def outputs(rng):
      variables = self.init_variables(rng, None)
      batch = self.dummy_batch()
      out = model.apply(variables, batch, method=model.backbone_embeddings)
      if self.caption == "language":
        out["words"] = model.apply(variables, batch, method=model.caption_words)[0]
      return out
    shapes = jax.eval_shape(outputs, jax.random.PRNGKey(0))
    self._widths = {k: int(v.shape[-1]) for k, v in shapes.items()}
    return self._widths

  def example_spec(self, *, train: bool):
    """`SMiTExamples`' arrays (train and eval alike; 'clip_id' is a host field). Every
    length is fixed by the config (the pipeline pads or cuts to it):

    clips (config.dataset.name not in FEATURE_DATASETS): image_frames / temporal_frames
      float32 [num_image_frames / num_temporal_frames, image_size, image_size, 3] (those
      of the backbones config.model.video has); language: input_ids, attention_mask,
      word_index int32 [max_text_len]; spoken: log_mel float32 [speech_frames,
      num_mel_bins], log_mel_mask int32 [speech_frames].
    features: image_embedding / temporal_embedding float32 [backbone width]; language:
      words float32 [model.max_words, text width], word_mask bool [model.max_words];
      spoken: log_mel / log_mel_mask as from clips (num_mel_bins: what the features
      tool computed them with). The widths are the model's (`_feature_widths`).
    """
    del train
    d, spec = self.config.data, task_registry.spec
    video = self.config.model.video
    if self.config.dataset.name in self.FEATURE_DATASETS:
      widths = self._feature_widths()
      out = {k: spec((widths[k],), "float32")
             for k in ("image_embedding", "temporal_embedding") if k in widths}
      if self.caption == "language":
        w = int(self.config.model.max_words)
        return {**out, "words": spec((w, widths["words"]), "float32"),
                "word_mask": spec((w,), "bool")}
    else:
      s = d.image_size
      out = {f"{k}_frames": spec((d[f"num_{k}_frames"], s, s, 3), "float32")
             for k in ("image", "temporal") if video.get(k)}
      if self.caption == "language":
        return {**out, **{k: spec((d.max_text_len,), "int32")
                          for k in ("input_ids", "attention_mask", "word_index")}}
    return {**out, "log_mel": spec((d.speech_frames, d.num_mel_bins), "float32"),
            "log_mel_mask": spec((d.speech_frames,), "int32")}

  def pretrained_towers(self):
    if self.caption != "language":
      return ()
    return (pretrained.Tower("model.text", ("caption", "text"), "bert"),)  # frozen

  def loss_fn(self, variables, batch, rng, *, step=0):
    sample_rng, dropout_rng = jax.random.split(rng)
    mutable = [k for k in variables if k != "params"] or False  # BatchNorm's batch_stats
    out = self.model.apply(variables, batch, train=True, mutable=mutable,
                           rngs={"sample": sample_rng, "dropout": dropout_rng})
    (video, caption), new_state = out if mutable else (out, {})
    sim = caption @ video.T  # [B_caption, B_video], global batch
    loss = self.sim_loss(sim, self.config.loss, step)
    return loss, retrieval_metrics.in_batch_metrics(sim), dict(new_state)

  def predict_fns(self):
    model = self.model

    def embed_video(variables, batch):
      return model.apply(variables, batch, method=model.encode_video)

    def embed_text(variables, batch):
      return model.apply(variables, batch, method=model.encode_caption)

    def backbone_embeddings(variables, batch):
      return model.apply(variables, batch, method=model.backbone_embeddings)

    def caption_words(variables, batch):
      return model.apply(variables, batch, method=model.caption_words)

    return {"embed_video": embed_video, "embed_text": embed_text,
            "backbone_embeddings": backbone_embeddings, "caption_words": caption_words}


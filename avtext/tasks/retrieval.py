"""Dual-encoder retrieval tasks. AVR (VideoCC §4.1): MBT video + BERT text, NCE.

Training: a batch of (clip, caption) pairs -> unit-norm embeddings -> the
similarity matrix of the *global* batch (under jit the sharded batch is one
array, so every device's captions are negatives for every video) -> NCE in
both directions with temperature sigma (VideoCC §5.2: 0.05).

Evaluation is the `retrieval` evaluator (`avtext/evals/retrieval.py`) over the
predict functions `embed_video` (K equally spaced clips per video, [B, K, D])
and `embed_text` ([B, D]); it averages the K clip similarities (VideoCC §4.1).
"""
import jax.numpy as jnp
import ml_collections

from avtext.data import pipelines
from avtext.losses import contrastive
from avtext.metrics import retrieval as retrieval_metrics
from avtext.modalities import parse_modalities
from avtext.tasks import task_registry
from avtext.weights import pretrained


@task_registry.register("avr")
class AVRTask(task_registry.ClipTask):
  """VideoCC audio-visual retrieval (`config.model.name = "dual_encoder"`)."""
  LOSSES = ("nce",)  # config.loss.name: VideoCC §3.2's NCE, the one loss `combine` computes

  def __init__(self, config: ml_collections.ConfigDict):
    name = config.get("loss", {}).get("name", "nce")
    if name not in self.LOSSES:
      raise ValueError(f"config.loss.name={name}: avr trains with {', '.join(self.LOSSES)}; "
                       f"set it to {self.LOSSES[0]}")
    super().__init__(config)
    self.tokenizer = pretrained.text_tokenizer(config)
    self.modalities = parse_modalities(config.model.video.modalities)

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data,
                                  self.tokenizer, train=train, modalities=self.modalities)

  def example_spec(self, *, train: bool):
    """`clip_spec` (rgb / audio / has_audio; eval: a K = eval_num_clips axis) + the
    caption's input_ids / attention_mask int32 [max_text_len]; one spec for both
    predict functions (the retrieval evaluator runs them on the same batch)."""
    n = self.config.data.max_text_len
    return {**self.clip_spec(train=train), "input_ids": task_registry.spec((n,), "int32"),
            "attention_mask": task_registry.spec((n,), "int32")}

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, task_registry.video_inputs(batch), batch["input_ids"],
                           batch["attention_mask"])

  def pretrained_towers(self):
    return (pretrained.Tower("model.video", ("video",), "vit"),  # model.video.init_from_vit
            pretrained.Tower("model.text", ("text",), "bert"))

  def encode(self, variables, batch, rng):
    video, text = self.model.apply(
        variables, task_registry.video_inputs(batch), batch["input_ids"],
        batch["attention_mask"], train=True, rngs={"dropout": rng})
    return {"video": video.astype(jnp.float32), "text": text.astype(jnp.float32)}, {}

  def combine(self, features, batch):
    del batch
    sim = features["text"] @ features["video"].T  # [B_text, B_video], global batch
    loss = contrastive.nce(sim, temperature=self.config.loss.temperature)
    return loss, retrieval_metrics.in_batch_metrics(sim)

  def loss_fn(self, variables, batch, rng):
    features, collections = self.encode(variables, batch, rng)
    return (*self.combine(features, batch), collections)

  def predict_fns(self):
    model = self.model

    def embed_video(variables, batch):  # [B, K, D]: every test clip of every video
      return task_registry.fold_clips(
          lambda x: model.apply(variables, x, method=model.encode_video),
          task_registry.video_inputs(batch))

    def embed_text(variables, batch):  # [B, D]
      return model.apply(variables, batch["input_ids"], batch["attention_mask"],
                         method=model.encode_text)

    return {"embed_video": embed_video, "embed_text": embed_text}

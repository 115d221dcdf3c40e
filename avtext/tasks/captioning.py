"""Video captioning (`config.task = "captioning"`): VideoCC's GPT-2 captioner (§4.2).

Training: teacher forcing on (clip, caption) pairs, the negative
log-likelihood of the caption's BPE tokens and EOS (VideoCC §4.2: "We minimise
the negative log-likelihood of generating the ground-truth caption"),
averaged over the batch's real target tokens; `config.loss.label_smoothing`
(0 for VideoCC, 0.1 for MMT) spreads that mass uniformly over the vocabulary.

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
from avtext.data import preprocessing
from avtext.inference import generate
from avtext.modalities import parse_modalities
from avtext.models import gpt2 as gpt2_lib
from avtext.tasks import registry
from avtext.weights import gpt2 as gpt2_weights

HOST_FIELDS = ("caption", "attributes", "clip_id")


def caption_tokenizer(config: ml_collections.ConfigDict) -> preprocessing.CaptionTokenizer:
  """The decoder's tokenizer: GPT-2 BPE, with `config.model.decoder.vocab_subset` if set."""
  dec = config.model.decoder
  tok = preprocessing.CaptionTokenizer(config.data.get("bpe_dir"),
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


@registry.register("captioning")
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
      return generate.generate(start, step, max_new_tokens=max_new, eos_id=eos,
                               beam_size=int(gen.beam_size),
                               min_length=int(gen.get("min_length", 0)),
                               length_penalty=float(gen.get("length_penalty", 0.0)))

    return {"captions": captions}

  def decode(self, tokens: np.ndarray) -> list[str]:
    return [self.tokenizer.decode(row) for row in np.asarray(tokens)]

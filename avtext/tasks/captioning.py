"""Video captioning (`config.task = "captioning"`): VideoCC's GPT-2 captioner (§4.2);
with `config.model.name = "mmt"` the same task name is TVC's MMT (`avtext/tasks/mmt.py`).

Training: teacher forcing on (clip, caption) pairs with the loss `config.loss.name`
names (`avtext.losses.captioning`; VideoCC: "nll", the negative log-likelihood of
the caption's tokens and EOS, `config.loss.label_smoothing` 0).

Prediction: `generate` decodes captions with `avtext.inference.generate`
(`config.generation`: beam_size, max_new_tokens, min_length,
length_penalty), the whole loop jitted with the KV cache. Evaluation is the
`captioning` evaluator (`avtext/evals/captioning.py`).

The video encoder can start from an AVR run: both models name it `video/`,
so `config.init_from.params = (("video/", "video/"),)` carries it over.
"""
import ml_collections
import numpy as np

from avtext.data import pipelines
from avtext.inference import generate
from avtext.losses import captioning as caption_losses
from avtext.modalities import parse_modalities
from avtext.models import gpt2 as gpt2_lib
from avtext.tasks import mmt
from avtext.tasks import task_registry
from avtext.text import tokenizers
from avtext.weights import pretrained

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


@task_registry.register("captioning")
def captioning_task(config: ml_collections.ConfigDict):
  """The captioning task of `config.model.name` (`CAPTIONERS`)."""
  name = config.model.get("name")
  if name not in CAPTIONERS:
    raise ValueError(f"task 'captioning': config.model.name={name!r}; expected "
                     "'video_captioner' (VideoCC) or 'mmt' (TVC)")
  return CAPTIONERS[name](config)


class CaptioningTask(task_registry.ClipTask):
  """Clip -> caption (`config.model.name = "video_captioner"`)."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.tokenizer = caption_tokenizer(config)
    super().__init__(config)
    self.modalities = parse_modalities(config.model.video.modalities)
    if config.data.get("eval_num_clips", 1) != 1:
      raise ValueError(f"captioning: config.data.eval_num_clips="
                       f"{config.data.eval_num_clips}; a caption is generated from one "
                       "(centre) clip per video, set it to 1")
    self.token_loss = caption_losses.get(config.loss.get("name", "nll"))

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data,
                                  self.tokenizer, train=train, modalities=self.modalities,
                                  host_fields=() if train else HOST_FIELDS)

  def example_spec(self, *, train: bool):
    """`clip_spec` (eval: K = eval_num_clips = 1 axis) + the caption's input_ids /
    target_ids / target_mask int32 [max_caption_len] (eval examples carry them too)."""
    n = self.config.data.max_caption_len
    return {**self.clip_spec(train=train),
            **{k: task_registry.spec((n,), "int32")
               for k in ("input_ids", "target_ids", "target_mask")}}

  def init_variables(self, rng, batch):
    return self.model.init({"params": rng}, task_registry.video_inputs(batch), batch["input_ids"])

  def pretrained_towers(self):
    return (pretrained.Tower("model.decoder", ("decoder",), "gpt2"),)

  def loss_fn(self, variables, batch, rng):
    logits = self.model.apply(variables, task_registry.video_inputs(batch), batch["input_ids"],
                              train=True, rngs={"dropout": rng})
    loss, metrics = self.token_loss(logits, batch["target_ids"], batch["target_mask"],
                                    self.config.loss.get("label_smoothing", 0.0))
    return loss, metrics, {}

  def predict_fns(self):
    model, gen = self.model, self.config.generation
    bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
    max_new = int(gen.max_new_tokens)

    def captions(variables, batch):  # {"tokens": [B, T], "lengths": [B], "scores": [B]}
      inputs = {k: v[:, 0] for k, v in task_registry.video_inputs(batch).items()}  # K = 1
      start, step = gpt2_lib.captioner_decoding_fns(model, variables, inputs, max_new, bos)
      return generate.from_config(gen, start, step, max_new_tokens=max_new, eos_id=eos)

    return {"captions": captions}

  def decode(self, tokens: np.ndarray) -> list[str]:
    return [self.tokenizer.decode(row) for row in np.asarray(tokens)]

  def train_captions(self, n: int) -> list[str]:
    """The first n training captions (the evaluator's most-frequent baseline)."""
    return pipelines.source_captions(self.train_source, n)


# `config.model.name` -> the class the `captioning` task name builds.
CAPTIONERS = {"video_captioner": CaptioningTask, "mmt": mmt.MmtCaptioningTask}

"""Dual-encoder retrieval tasks. AVR (VideoCC §4.1): MBT video + BERT text, NCE.

Training: a batch of (clip, caption) pairs -> unit-norm embeddings -> the
similarity matrix of the *global* batch (under jit the sharded batch is one
array, so every device's captions are negatives for every video) -> NCE in
both directions with temperature sigma (VideoCC §5.2: 0.05).

Evaluation (VideoCC §4.1/§5.2): K equally spaced clips per video, each
compared with the caption embedding, similarities averaged over the K clips;
text->video and video->text R@1/5/10, median and mean rank.
"""
import json
import pathlib

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from avtext.data import builders
from avtext.data import pipelines
from avtext.data import preprocessing
from avtext.losses import contrastive
from avtext.metrics import retrieval as retrieval_metrics
from avtext.models import bert as bert_lib
from avtext.models import dual_encoder
from avtext.models import mbt as mbt_lib
from avtext.tasks import registry
from avtext.train import partitioning
from avtext.weights import assets
from avtext.weights import bert as bert_weights


def text_weights_dir(text: ml_collections.ConfigDict) -> pathlib.Path | None:
  """config.model.text.weights: None (random init), 'minilm-l6', or a HF BERT dir."""
  if not text.get("weights"):
    return None
  if text.weights == "minilm-l6":
    return assets.minilm_l6_dir()
  path = pathlib.Path(text.weights)
  if not (path / "config.json").exists():
    raise FileNotFoundError(f"config.model.text.weights={text.weights!r}: no config.json "
                            "there; expected a local HF BERT directory (config.json + "
                            "model.safetensors + vocab.txt) or 'minilm-l6'")
  return path


def build_video_encoder(v: ml_collections.ConfigDict) -> mbt_lib.MBT:
  """The MBT of `config.model.video`."""
  return mbt_lib.MBT(
      modalities=v.modalities, hidden_size=v.hidden_size, num_layers=v.num_layers,
      num_heads=v.num_heads, mlp_dim=v.mlp_dim,
      rgb_patch_size=tuple(v.rgb_patch), audio_patch_size=tuple(v.audio_patch),
      n_bottlenecks=v.n_bottlenecks, fusion_layer=v.fusion_layer,
      dropout_rate=v.dropout_rate, attention_dropout_rate=v.attention_dropout_rate,
      stochastic_depth=v.get("stochastic_depth", 0.0))


def build_model(config: ml_collections.ConfigDict) -> dual_encoder.DualEncoder:
  t = config.model.text
  video = build_video_encoder(config.model.video)
  weights = text_weights_dir(t)
  if weights is not None:  # architecture from the checkpoint's own config.json
    text_kwargs = bert_weights.bert_kwargs_from_hf_config(
        json.loads((weights / "config.json").read_text()), str(weights / "config.json"))
  else:
    text_kwargs = dict(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, num_layers=t.num_layers,
        num_heads=t.num_heads, mlp_dim=t.intermediate_size,
        max_position_embeddings=t.max_position_embeddings)
  text_kwargs["dropout_rate"] = t.dropout_rate
  text_kwargs["attention_dropout_rate"] = t.dropout_rate
  return dual_encoder.DualEncoder(video=video, text=bert_lib.Bert(**text_kwargs),
                                  embed_dim=config.model.embed_dim)


def video_inputs(batch: dict) -> dict:
  """The MBT's inputs in a batch (both modalities; MBT ignores the one it lacks)."""
  return {"rgb": batch["rgb"], "audio": batch["audio"]}


@registry.register("avr")
class AVRTask(registry.ClipTask):
  """VideoCC audio-visual retrieval."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config, build_model(config))
    weights = text_weights_dir(config.model.text)
    vocab = config.data.get("vocab") or (
        weights / "vocab.txt" if weights is not None else assets.minilm_l6_dir() / "vocab.txt")
    self.tokenizer = preprocessing.Tokenizer(vocab, max_len=config.data.max_text_len)
    self._encode_cache = (None, None)  # (mesh, jitted encoder), see _encode_fn

  def examples(self, source, *, train: bool) -> pipelines.ClipExamples:
    return pipelines.ClipExamples(pipelines.ClipReader(source), self.config.data,
                                  self.tokenizer, train=train)

  def init_params(self, rng, batch):
    return self._model.init({"params": rng}, video_inputs(batch), batch["input_ids"],
                            batch["attention_mask"])["params"]

  def load_pretrained(self, params):
    weights = text_weights_dir(self.config.model.text)
    if weights is None:
      return params
    _, text_params = bert_weights.load_hf_bert(weights)
    expected = jax.tree.map(lambda x: (x.shape, x.dtype), params["text"])
    loaded = jax.tree.map(lambda x: (x.shape, x.dtype), text_params)
    if expected != loaded:
      raise ValueError(f"{weights}: pretrained text tower does not match the model's "
                       "text parameters (config.model.text disagrees with its config.json)")
    params = dict(params)
    params["text"] = text_params
    logging.info("text tower initialised from %s", weights)
    return params

  def loss_fn(self, params, batch, rng):
    video, text = self._model.apply(
        {"params": params}, video_inputs(batch), batch["input_ids"],
        batch["attention_mask"], train=True, rngs={"dropout": rng})
    sim = text @ video.T  # [B_text, B_video], global batch
    loss = contrastive.nce(sim, temperature=self.config.loss.temperature)
    hits = jnp.argmax(sim, axis=1) == jnp.arange(sim.shape[0])
    return loss, {"batch_t2v_r1": 100.0 * jnp.mean(hits),
                  "positive_sim": jnp.mean(jnp.diagonal(sim))}

  # ---- evaluation ---------------------------------------------------------

  def embed(self, params, source, *, mesh) -> tuple[np.ndarray, np.ndarray]:
    """(text [N, D], video [N, K, D]) embeddings of a split, K test clips per video."""
    encode = self._encode_fn(mesh)
    return registry.map_examples(
        lambda batch: encode(params, batch), self.examples(source, train=False), len(source),
        mesh=mesh, global_batch_size=self.config.eval.batch_size)

  def _encode_fn(self, mesh):
    """jit(params, batch) -> (text [B, D], video [B, K, D]); compiled once per mesh."""
    if self._encode_cache[0] is not mesh:
      model, shard = self._model, partitioning.data_sharding(mesh)

      def encode(params, batch):
        b, k = batch["rgb"].shape[:2]
        flat = jax.tree.map(lambda x: x.reshape((b * k,) + x.shape[2:]), video_inputs(batch))
        video = model.apply({"params": params}, flat, method=model.encode_video)
        text = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                           method=model.encode_text)
        return jax.lax.with_sharding_constraint(text, shard), video.reshape(b, k, -1)

      self._encode_cache = (mesh, jax.jit(encode))
    return self._encode_cache[1]

  def evaluate(self, params, *, mesh, workdir, step) -> dict[str, float]:
    config = self.config
    source = builders.clip_source(config.dataset, config.dataset.eval_split,
                                  name=config.dataset.eval_name)
    text, video = self.embed(params, source, mesh=mesh)
    # VideoCC §4.1: compare each of the K clips with the caption, average the scores.
    sim = np.einsum("qd,nkd->qn", text, video) / video.shape[1]  # [N_text, N_video]
    results = {}
    for name, metrics in (("t2v", retrieval_metrics.retrieval_metrics(sim)),
                          ("v2t", retrieval_metrics.retrieval_metrics(sim.T))):
      results.update({f"{name}_{k}": float(v) for k, v in metrics.items()})
    n = sim.shape[0]
    results["chance_r1"] = 100.0 / n
    results["num_videos"] = n
    results.update(_synthetic_references(source, sim))
    _print_table(results, step)
    return results


def _synthetic_references(source, sim: np.ndarray) -> dict[str, float]:
  """Oracle R@1 and the sound-mentioning subset, for the synthetic world only."""
  if not hasattr(source, "oracle_recall_at_1"):
    return {}
  out = {"oracle_t2v_r1": float(source.oracle_recall_at_1())}
  sound = np.array([source.describe(i)["mentions_sound"] for i in range(sim.shape[0])])
  if sound.any():
    sub = retrieval_metrics.retrieval_metrics(sim[sound], gt=np.flatnonzero(sound))
    out["sound_t2v_r1"] = float(sub["R@1"])
    out["sound_oracle_t2v_r1"] = float(source.oracle_recall_at_1(np.flatnonzero(sound)))
    out["sound_num_captions"] = int(sound.sum())
  return out


def _print_table(results: dict, step: int) -> None:
  lines = [f"== AVR retrieval, step {step}, {results['num_videos']} videos =="]
  for d in ("t2v", "v2t"):
    lines.append(f"{d}: R@1 {results[f'{d}_R@1']:6.2f}  R@5 {results[f'{d}_R@5']:6.2f}  "
                 f"R@10 {results[f'{d}_R@10']:6.2f}  MdR {results[f'{d}_MdR']:7.1f}  "
                 f"MnR {results[f'{d}_MnR']:7.1f}")
  ref = f"chance R@1 {results['chance_r1']:.2f}"
  if "oracle_t2v_r1" in results:
    ref += (f"   oracle t2v R@1 {results['oracle_t2v_r1']:.2f}   "
            f"model/oracle {100 * results['t2v_R@1'] / results['oracle_t2v_r1']:.1f}%")
  lines.append(ref)
  if "sound_t2v_r1" in results:
    lines.append(f"sound-mentioning captions ({results['sound_num_captions']}): t2v R@1 "
                 f"{results['sound_t2v_r1']:.2f}  oracle {results['sound_oracle_t2v_r1']:.2f}")
  print("\n".join(lines), flush=True)

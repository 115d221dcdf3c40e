"""Mixed precision and rematerialization (`config.model.dtype` / `.remat`) of every model
family besides MBT, BERT and the dual encoder (those: tests/test_models_precision.py).

Each case is a family's tiny model (its config's `:tiny` sizes, or the small models of the
family's own test file, whose helpers are imported), one batch and the family's real loss
(the task's `loss_fn`, or the function it calls), all from the same float32 parameters:

  (a) dtype="bfloat16": |loss_bf16 - loss_f32| / |loss_f32| <= REL_LOSS and the cosine of
      the flattened gradient vectors >= MIN_COSINE. Measured on the 2-core CPU (jax 0.10.2),
      relative loss difference / gradient cosine:
        gpt2 captioner (MBT + GPT-2, dropout)                      4.5e-7 / 0.99997
        mmt (dropout)                                              7.6e-5 / 0.99996
        coot (with CMC)                                            3.4e-5 / 0.9997
        xml (hard negatives + ConvSE span loss, dropout)           1.3e-3 / 0.99998
        video classifier (MBT + head)                              1.5e-3 / 0.9997
        smit spoken (ResNet frames backbone + ResNet speech)       3.2e-5 / 0.9938
        smit resdavenet (ResNet frames backbone + ResDAVEnet)      8.4e-5 / 0.978
      REL_LOSS = 1e-2; MIN_COSINE = 0.99, and 0.95 for the BatchNorm networks: their
      bfloat16 gradients are noisier (4-channel stems on 4 examples: the stem kernel, half
      the gradient norm, has cosine 0.96; BatchNorm's backward subtracts the cotangents'
      means, which cancels digits; a float32 BatchNorm output moved 0.978 only to 0.982);
  (b) remat="full": gradients (and BatchNorm's updated batch_stats) equal the plain ones
      within relative 1e-6 (`test_models_precision.relative_difference`; measured <= 6.4e-8, most
      exactly 0), the loss within 1e-6;
  (c) in bfloat16 mode every parameter and batch statistic stays float32 and the parameter
      trees are those of float32, the losses see float32; an unset dtype builds the
      float32 / no-remat model. That path was checked bit-identical to the code before
      (init, loss, gradients, batch_stats, eval outputs, cached decoding of every case,
      under jit) with the previous modules side by side; here the family test files, which
      pass unchanged, guard it.

Autoregressive decoding (GPT-2 captioner, MMT) runs in bfloat16 with a bfloat16 KV cache;
feeding the teacher-forced tokens through start/step gives float32 logits within
DECODE_REL = 3e-2 of the largest float32 teacher-forced logit (measured 3.5e-3 and 6.9e-3),
and greedy generation runs (MMT: with [UNK] banned).

Every jitted function is compiled with LLVM at -O0 (FAST_COMPILE): compiling dominates;
the file takes ~90 s on 2 shared cores.
"""
import dataclasses
import pathlib
import re
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from avtext.inference import generate
from avtext.losses import captioning as caption_losses
from avtext.models import gpt2 as gpt2_lib
from avtext.models import mmt as mmt_lib
from avtext.models import model_registry
from avtext.tasks import task_registry
from tests import test_tasks_mmt
from tests import test_tasks_xml
from tests.test_models_precision import relative_difference

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
# pylint: disable=g-import-not-at-top,wrong-import-position
import coot_activitynet
import smit_spoken_amm
import synthetic_video_pretrain
import xml_tvr

REL_LOSS = 1e-2
MIN_COSINE = 0.99
MIN_COSINE_BATCHNORM = 0.95  # ResNet / ResDAVEnet (module docstring)
REMAT_REL = 1e-6
DECODE_REL = 3e-2  # max |logit difference| / max |logit| (module docstring)
# LLVM at -O0: halves the compile time that dominates these tiny models (the XLA graph
# optimizations, hence the numerics of the comparisons, are unchanged).
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _jit(fn: Callable, *args):
  """fn(*args), jitted and compiled with FAST_COMPILE."""
  return jax.jit(fn).lower(*args).compile(FAST_COMPILE)(*args)

# The small MBT of tests/test_models_gpt2.py (rgb 2 x 16 x 16, 4 patch tokens + [CLS]).
_MBT = dict(name="mbt", modalities="rgb", hidden_size=16, num_layers=1, num_heads=2,
            mlp_dim=32, rgb_patch=(2, 8, 8), audio_patch=(8, 8), n_bottlenecks=1,
            fusion_layer=1, dropout_rate=0.0, attention_dropout_rate=0.0)


@dataclasses.dataclass
class Case:
  """config: the whole experiment config (its `model` node is varied); make(config) ->
  (init(rng) -> variables, loss(variables, rng) -> (scalar loss, updated non-param state))."""
  config: ml_collections.ConfigDict
  make: Callable[[ml_collections.ConfigDict], tuple[Callable, Callable]]
  min_cosine: float = MIN_COSINE


def _task_case(config: ml_collections.ConfigDict, batch: dict, init_args: Callable,
               **kwargs) -> Case:
  """A case whose loss is the task's own `loss_fn`."""
  def make(cfg):
    task = task_registry.build_task(cfg)
    init = lambda rng: task.model.init({"params": rng, "dropout": rng, "sample": rng},
                                       *init_args(batch), **_init_kwargs(cfg))
    return init, lambda variables, rng: _loss_state(task.loss_fn(variables, batch, rng))
  return Case(config, make, **kwargs)


def _init_kwargs(cfg):
  return {"train": False} if cfg.model.name == "smit" else {}


def _loss_state(out):
  loss, _, state = out
  return loss, state


# ------------------------------------------------------------------------------ the cases


def _captioner_case() -> Case:
  """VideoCC's captioner: the tests' small MBT + GPT-2 (tiny config's decoder sizes),
  `caption_losses.sequence_nll` as CaptioningTask.loss_fn."""
  model = ml_collections.ConfigDict(dict(
      name="video_captioner", context_groups=None, video=_MBT,
      decoder=dict(name="gpt2", vocab_size=23, max_positions=16, hidden_size=32,
                   num_layers=2, num_heads=2, mlp_dim=64, dropout_rate=0.1,
                   attention_dropout_rate=0.1)))
  rng = np.random.default_rng(0)
  rgb = jnp.asarray(rng.normal(size=(3, 2, 16, 16, 3)), jnp.float32)
  ids = jnp.asarray(rng.integers(0, 23, (3, 7)), jnp.int32)
  targets = jnp.concatenate([ids[:, 1:], jnp.zeros((3, 1), jnp.int32)], axis=1)
  mask = jnp.asarray([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4], jnp.float32)

  def make(cfg):
    m = model_registry.build_model(cfg.model)
    def loss(variables, r):
      logits = m.apply(variables, {"rgb": rgb}, ids, train=True, rngs={"dropout": r})
      return caption_losses.sequence_nll(logits, targets, mask, 0.1)[0], {}
    return (lambda r: m.init(r, {"rgb": rgb}, ids)), loss
  return Case(ml_collections.ConfigDict(dict(model=model)), make)


def _mmt_case() -> Case:
  """TVC's MMT: tests/test_tasks_mmt.py's tiny model (one encoder and one decoder layer) and
  context, the label-smoothed NLL of MmtCaptioningTask.loss_fn."""
  model = ml_collections.ConfigDict(dict(
      name="mmt", vocab_size=23, video_dim=6, hidden_size=16, num_layers=1, num_heads=2,
      intermediate_size=16, word_dim=8, max_positions=24, dropout_rate=0.1,
      attention_dropout_rate=0.1))
  rng = np.random.default_rng(0)
  ctx = test_tasks_mmt._context(rng)  # pylint: disable=protected-access
  caption = rng.integers(4, 23, size=(3, 7)).astype(np.int32)
  targets = np.roll(caption, -1, axis=1)
  mask = np.ones((3, 7), np.float32)

  def make(cfg):
    m = model_registry.build_model(cfg.model)
    def loss(variables, r):
      logits = m.apply(variables, *ctx, caption, train=True, rngs={"dropout": r})
      return caption_losses.sequence_nll(logits, targets, mask, 0.1)[0], {}
    return (lambda r: m.init(r, *ctx, caption)), loss
  return Case(ml_collections.ConfigDict(dict(model=model)), make)


def _coot_case() -> Case:
  """COOT at configs/coot_activitynet.py:tiny sizes, CootTask.loss_fn (eq. 9 with CMC)."""
  config = coot_activitynet.get_config("tiny")
  config.data.pad_multiple, config.data.clip_pad_multiple = 4, 8
  config.model.dropout = 0.0  # hash dropout masks double the compile time (~10 s)
  config.data.pack_sequences = False  # the model's arguments below: the padded layout
  task = task_registry.build_task(config)
  rng = np.random.default_rng(0)
  examples = []
  for i, clips in enumerate(([5, 3, 4], [6, 2])):
    sentences = [3, 5, 2][:len(clips)]
    examples.append(dict(
        video=rng.normal(size=(9, 16)).astype(np.float32),
        clip_frames=rng.normal(size=(sum(clips), 16)).astype(np.float32),
        clip_lengths=np.asarray(clips, np.int32),
        paragraph=rng.normal(size=(sum(sentences), 24)).astype(np.float32),
        sentence_lengths=np.asarray(sentences, np.int32), id=str(i)))
  batch = task.collate(examples)
  keys = ("video", "video_mask", "clips", "clips_mask", "clip_slot", "paragraph",
          "paragraph_mask", "sentences", "sentences_mask", "clip_slot")
  batch = {k: v for k, v in batch.items() if k in keys}
  return _task_case(config, batch, lambda b: [b[k] for k in keys])


def _xml_case() -> Case:
  """XML at configs/xml_tvr.py:tiny sizes on tests/test_tasks_xml.py's inputs, XMLTask.loss_fn
  (VR hinge with sampled and hard negatives + span NLL)."""
  config = xml_tvr.get_config("tiny")
  q, qm, ctx, _ = test_tasks_xml._inputs(np.random.default_rng(0), b=4)  # pylint: disable=protected-access
  cm = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 6], jnp.int32)
  batch = dict(query=q, query_mask=qm, ctx_mask=cm, **ctx,
               start=jnp.asarray([0, 1, 2, 3]), end=jnp.asarray([2, 3, 4, 4]),
               epoch=jnp.zeros((4,), jnp.int32))
  return _task_case(config, batch, lambda b: (b["query"], b["query_mask"],
                                              {m: b[m] for m in ("video", "sub")}, b["ctx_mask"]))


def _smit_config(speech: dict) -> ml_collections.ConfigDict:
  config = smit_spoken_amm.get_config("tiny")
  config.model.video = ml_collections.ConfigDict(dict(
      image=dict(name="resnet", depth=18, width=4, stage_sizes=(1, 1)), temporal=None,
      image_mode="frames", train_backbones=True))
  config.model.speech = ml_collections.ConfigDict(speech)
  return config


def _smit_batch(frames: int) -> dict:
  rng = np.random.default_rng(0)
  mask = np.ones((4, frames), np.int32)
  mask[1, frames // 2:] = 0
  return {"image_frames": jnp.asarray(rng.uniform(size=(4, 2, 32, 32, 3)), jnp.float32),
          "log_mel": jnp.asarray(rng.normal(size=(4, frames, 40)), jnp.float32),
          "log_mel_mask": jnp.asarray(mask)}


def _smit_spoken_case() -> Case:
  """S-MiT spoken (configs/smit_spoken_amm.py:tiny: ResNet-18 / 4 speech model, AMM loss)
  with a tiny ResNet image backbone in "frames" mode trained too; SMiTTask.loss_fn (BatchNorm
  statistics updated)."""
  config = _smit_config(dict(name="resnet", depth=18, width=4, in_channels=1,
                             stage_sizes=(1, 1)))
  return _task_case(config, _smit_batch(48), lambda b: (b,), min_cosine=MIN_COSINE_BATCHNORM)


def _smit_resdavenet_case() -> Case:
  """As `_smit_spoken_case` with a small ResDAVEnet speech model (masked pooling)."""
  config = _smit_config(dict(name="resdavenet", widths=(8, 8, 8, 16, 16), blocks=(1, 1, 1, 1),
                             kernel=5))
  return _task_case(config, _smit_batch(64), lambda b: (b,), min_cosine=MIN_COSINE_BATCHNORM)


def _classifier_case() -> Case:
  """heads.VideoClassifier (configs/synthetic_video_pretrain.py:tiny, the tests' small MBT),
  VideoClassificationTask.loss_fn (sigmoid cross-entropy)."""
  config = synthetic_video_pretrain.get_config("tiny")
  config.model.video = ml_collections.ConfigDict(_MBT)
  rng = np.random.default_rng(0)
  batch = {"rgb": jnp.asarray(rng.normal(size=(4, 2, 16, 16, 3)), jnp.float32),
           "labels": jnp.asarray(rng.integers(0, 2, (4, 26)), jnp.float32)}
  return _task_case(config, batch, lambda b: ({"rgb": b["rgb"]},))


CASES = {"gpt2_captioner": _captioner_case, "mmt": _mmt_case, "coot": _coot_case,
         "xml": _xml_case, "smit_spoken": _smit_spoken_case,
         "smit_resdavenet": _smit_resdavenet_case, "video_classifier": _classifier_case}


# ------------------------------------------------------------------------------ helpers


def _with(config: ml_collections.ConfigDict, **compute) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.update(compute)
  return config


def _value_and_grad(loss: Callable, variables: dict, rng) -> tuple[Any, Any, dict]:
  def f(params):
    return loss({**variables, "params": params}, rng)
  (value, state), grads = _jit(jax.value_and_grad(f, has_aux=True), variables["params"])
  return value, grads, state


def _cosine(a, b) -> float:
  a = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(a)])
  b = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(b)])
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _rematerialized(fn: Callable, *args) -> bool:
  """Whether fn's trace holds a jax.checkpoint (printed remat2[...] in jax 0.10)."""
  return re.search(r"\b(remat\d*|checkpoint)\[", str(jax.make_jaxpr(fn)(*args))) is not None


def _dtypes(tree) -> set:
  return {np.dtype(x.dtype) for x in jax.tree.leaves(tree)}


# ------------------------------------------------------------------------------ tests


# The six longest cases run with -m slow (`make test-slow`, which CI runs too) to keep
# the default run within its budget.
_SLOW_CASES = ("coot", "xml", "mmt", "smit_resdavenet", "smit_spoken", "gpt2_captioner")
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in _SLOW_CASES else n for n in CASES])
def test_bfloat16_and_remat_against_float32(name):
  case = CASES[name]()
  init, loss_f32 = case.make(case.config)
  variables = _jit(init, jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)
  value, grads, state = _value_and_grad(loss_f32, variables, rng)
  assert np.isfinite(float(value)) and _dtypes(grads) == {np.dtype(np.float32)}

  # (c) an unset dtype is the float32 / no-remat model; bfloat16 keeps float32 variables.
  init_bf16, loss_bf16 = case.make(_with(case.config, dtype="bfloat16"))
  shapes = jax.eval_shape(init_bf16, jax.random.PRNGKey(0))
  assert jax.tree.structure(shapes) == jax.tree.structure(variables)
  assert _dtypes(shapes) <= {np.dtype(np.float32), np.dtype(np.int32)}

  # (a) bfloat16 computation, the same float32 parameters.
  value16, grads16, state16 = _value_and_grad(loss_bf16, variables, rng)
  assert np.dtype(value16.dtype) == np.float32 and _dtypes(grads16) == {np.dtype(np.float32)}
  rel_loss = abs(float(value16) - float(value)) / abs(float(value))
  cosine = _cosine(grads16, grads)
  print(f"{name}: bf16 loss {float(value16):.6f} vs f32 {float(value):.6f} (relative "
        f"{rel_loss:.2e}), gradient cosine {cosine:.6f}")
  assert rel_loss <= REL_LOSS
  assert cosine >= case.min_cosine
  assert jax.tree.structure(state16) == jax.tree.structure(state)
  assert _dtypes(state16) <= {np.dtype(np.float32)}  # batch_stats

  # (b) rematerialized blocks (jax.checkpoint in the trace): the same gradients and
  # batch statistics.
  _, loss_remat = case.make(_with(case.config, remat="full"))
  assert _rematerialized(loss_remat, variables, rng)
  assert not _rematerialized(loss_f32, variables, rng)
  value_r, grads_r, state_r = _value_and_grad(loss_remat, variables, rng)
  diff = relative_difference(grads_r, grads)
  print(f"{name}: remat=full relative gradient difference {diff:.2e}")
  assert float(value_r) == pytest.approx(float(value), rel=REMAT_REL)
  assert jax.tree.structure(grads_r) == jax.tree.structure(grads)
  assert diff <= REMAT_REL
  if jax.tree.leaves(state):  # BatchNorm statistics: updated once, by the forward pass
    state_diff = relative_difference(state_r, state)
    print(f"{name}: remat=full relative batch_stats difference {state_diff:.2e}")
    assert state_diff <= REMAT_REL


def test_unset_fields_build_the_float32_model_and_sub_nodes_inherit():
  case = _smit_config(dict(name="resdavenet", widths=(8, 8, 8, 8, 8)))
  model = model_registry.build_model(case.model)
  assert model.video.image.dtype == jnp.float32 and model.video.image.remat == "none"
  assert model.caption.head.dtype == jnp.float32
  config = _with(case, dtype="bfloat16", remat="full")
  config.model.speech.remat = "none"  # a node's own setting wins
  model = model_registry.build_model(config.model)
  assert model.video.image.dtype == jnp.bfloat16 and model.video.image.remat == "full"
  assert model.video.head.dtype == model.caption.head.dtype == jnp.bfloat16
  assert model.caption.encoder.dtype == jnp.bfloat16 and model.caption.encoder.remat == "none"
  captioner = model_registry.build_model(_with(_captioner_case().config,
                                               dtype="bfloat16", attention="blocked").model)
  video, decoder = captioner.video.compute, captioner.decoder.compute
  assert captioner.dtype == video.dtype == decoder.dtype == jnp.bfloat16
  assert decoder.attention == video.attention == "blocked"
  xml_config = _with(xml_tvr.get_config("tiny"), dtype="bfloat16", remat="full")
  xml_model = model_registry.build_model(xml_config.model)
  assert (xml_model.compute.dtype, xml_model.compute.remat) == (jnp.bfloat16, "full")
  with pytest.raises(ValueError, match="unknown XML field"):
    model_registry.build_model(_with(xml_config, span="x").model)


def _teacher_forced_and_greedy(start, step, tokens, max_new, eos):
  """One jitted call: (logits of feeding `tokens` [B, T] through start/step, the cache after
  the first call, greedy generation's output)."""
  def run():
    logits, cache = start()
    first_cache, got = cache, [logits]
    for t in range(1, tokens.shape[1]):
      logits, cache = step(cache, tokens[:, t], t)
      got.append(logits)
    return jnp.stack(got, 1), first_cache, generate.greedy(start, step, max_new_tokens=max_new,
                                                           eos_id=eos)
  return _jit(run)


def _check_decoding(name: str, got, want):
  got, want = np.asarray(got), np.asarray(want)
  rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
  print(f"{name}: bf16 cached decoding vs f32 teacher forcing, max |logit difference| / "
        f"max |logit| = {rel:.1e}")
  assert rel <= DECODE_REL


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_bfloat16_decoding_gpt2_captioner():
  """start/step with a bfloat16 KV cache: float32 logits near the float32 teacher-forced ones."""
  case = _captioner_case()
  f32 = model_registry.build_model(case.config.model)
  bf16 = model_registry.build_model(_with(case.config, dtype="bfloat16").model)
  rgb = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 16, 16, 3))
  ids = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 23).at[:, 0].set(0)  # BOS 0
  variables = _jit(f32.init, jax.random.PRNGKey(2), {"rgb": rgb}, ids)
  want = _jit(f32.apply, variables, {"rgb": rgb}, ids)
  start, step = gpt2_lib.captioner_decoding_fns(bf16, variables, {"rgb": rgb}, 6, 0)
  got, cache, out = _teacher_forced_and_greedy(start, step, ids, 6, 1)
  assert {np.dtype(x.dtype) for x in jax.tree.leaves(cache) if x.ndim == 4} == {
      np.dtype(jnp.bfloat16)}
  assert got.dtype == jnp.float32
  _check_decoding("gpt2 captioner", got, want)
  assert out["tokens"].shape == (2, 6) and np.all(np.asarray(out["tokens"]) < 23)


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_bfloat16_decoding_mmt():
  """MMT's cached decoding in bfloat16, logits near float32's; greedy bans UNK."""
  case = _mmt_case()
  f32 = model_registry.build_model(case.config.model)
  bf16 = model_registry.build_model(_with(case.config, dtype="bfloat16").model)
  rng = np.random.default_rng(3)
  ids, video, mask, types = test_tasks_mmt._context(rng)  # pylint: disable=protected-access
  caption = rng.integers(4, 23, size=(3, 7)).astype(np.int32)
  caption[:, 0] = mmt_lib.BOS
  variables = _jit(f32.init, jax.random.PRNGKey(2), ids, video, mask, types, caption)
  want = _jit(f32.apply, variables, ids, video, mask, types, caption)
  ctx = dict(ctx_ids=ids, video=video, ctx_mask=mask, token_type_ids=types)
  start, step = mmt_lib.captioner_decoding_fns(bf16, variables, ctx, 7)
  got, cache, out = _teacher_forced_and_greedy(start, step, caption, 7, mmt_lib.EOS)
  assert {np.dtype(x.dtype) for x in jax.tree.leaves(cache) if x.ndim == 4} == {
      np.dtype(jnp.bfloat16)}
  got = np.array(got)
  assert np.all(got[..., mmt_lib.UNK] == -np.inf)  # banned
  got[..., mmt_lib.UNK] = np.asarray(want)[..., mmt_lib.UNK]
  _check_decoding("mmt", got, want)
  assert mmt_lib.UNK not in np.asarray(out["tokens"])

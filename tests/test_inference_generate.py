"""Jitted greedy / beam search with the KV cache against slow reference decoders."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext.inference import generate
from avtext.models import gpt2 as gpt2_lib
from avtext.models import mbt

V = 13


EOS = None  # set per model by _tiny_lm


def _tiny_lm(seed, prompt=None):
  """A random tiny GPT-2 and, for `prompt`, an EOS id that ends some rows but not all.

  Random tiny transformers mostly repeat a few tokens; taking as EOS a token
  the model emits mid-sequence in one row makes some hypotheses finish early
  (found with the reference decoder, EOS disabled).
  """
  global EOS
  model = gpt2_lib.GPT2(vocab_size=V, max_positions=32, hidden_size=16, num_layers=2,
                        num_heads=2, mlp_dim=32)
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"]
  # Sharper distributions than the N(0, 0.02) init, so greedy and beam differ.
  params = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, params)
  EOS = -1
  if prompt is not None:
    free = _reference_greedy(model, params, prompt, 8, 0)
    # The first token of some row, at position >= 3, that the row has not
    # emitted before (so min_length <= 3 cannot change the path to it).
    EOS = next(int(free[r, i]) for i in range(3, 8) for r in range(len(free))
               if free[r, i] not in free[r, :i])
  else:
    EOS = 0
  return model, params


_REF_LEN = 16  # the references' forward passes all pad to this: one program per batch size


@functools.partial(jax.jit, static_argnums=0)
def _logits_at(model, params, padded, pos):
  return model.apply({"params": params}, padded)[:, pos]


def _last_logits(model, params, seq):
  """The logits after the last token of `seq` by a full causal forward pass; the pass
  runs over `seq` right-padded to _REF_LEN (positions never see later ones)."""
  seq = jnp.asarray(seq)
  padded = jnp.pad(seq, ((0, 0), (0, _REF_LEN - seq.shape[1])))
  return _logits_at(model, params, padded, seq.shape[1] - 1)


def _full_logp(model, params, seq):
  """log p(next | seq) by a full forward pass (no cache): [V] per row."""
  logits = _last_logits(model, params, jnp.asarray(seq))
  return np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)


def _reference_greedy(model, params, prompt, t_max, min_length):
  b = prompt.shape[0]
  seqs = [list(r) for r in prompt]
  out = np.full((b, t_max), max(EOS, 0))
  done = np.zeros(b, bool)
  for i in range(t_max):
    logp = _full_logp(model, params, np.array(seqs))
    if i < min_length:
      logp[:, EOS] = -np.inf
    tok = np.argmax(logp, axis=1)
    for r in range(b):
      if not done[r]:
        out[r, i] = tok[r]
        done[r] = tok[r] == EOS
      seqs[r].append(int(tok[r]) if not done[r] or tok[r] == EOS else EOS)
    if done.all():
      break
  return out


def _score(model, params, prompt_row, tokens, length_penalty):
  """The module's score of one hypothesis (tokens up to and including EOS)."""
  seq = list(prompt_row)
  total, n = 0.0, 0
  for tok in tokens:
    total += _full_logp(model, params, np.array([seq]))[0, tok]
    seq.append(int(tok))
    n += 1
    if tok == EOS:
      break
  return total / n ** length_penalty


def _reference_beam(model, params, prompt_row, k, t_max, min_length, length_penalty):
  """Textbook beam search with full recomputation: the same rules, in Python."""
  alive = [(0.0, [])]
  finished = []
  for i in range(t_max):
    cands = []
    for logp_sum, toks in alive:
      logp = _full_logp(model, params, np.array([list(prompt_row) + toks]))[0]
      if i < min_length:
        logp[EOS] = -1e9
      for tok in range(V):
        cands.append((logp_sum + logp[tok], toks + [tok]))
    cands.sort(key=lambda c: -c[0])
    cands = cands[:2 * k]
    finished += [(s / (i + 1) ** length_penalty, t) for rank, (s, t) in enumerate(cands)
                 if t[-1] == EOS and rank < k]
    finished = sorted(finished, key=lambda c: -c[0])[:k]
    alive = [c for c in cands if c[1][-1] != EOS][:k]
    bound = max(s for s, _ in alive) / t_max ** length_penalty
    if len(finished) == k and bound <= finished[-1][0]:
      break
  else:
    finished += [(s / t_max ** length_penalty, t) for s, t in alive]
  return sorted(finished, key=lambda c: -c[0])[0]


@functools.partial(jax.jit, static_argnums=(0, 3, 5, 6, 7, 8))  # eos is traced
def _run(model, params, prompt, t_max, eos, beam_size, min_length, lp, guard):
  start, step = gpt2_lib.lm_decoding_fns(model, params, prompt, t_max)
  return generate.generate(start, step, max_new_tokens=t_max, eos_id=eos, beam_size=beam_size,
                           min_length=min_length, length_penalty=lp, guard_greedy=guard)


def _decode(model, params, prompt, t_max, beam_size=1, min_length=0, length_penalty=0.0,
            guard_greedy=True):
  out = _run(model, params, jnp.asarray(prompt), t_max, EOS, beam_size, min_length,
             length_penalty, guard_greedy)
  return jax.tree.map(np.asarray, out)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_prefill_and_steps_equal_full_forward_logits():
  """The prefill projects only the last prompt position; it and each cached step (the
  heads-major cache) give the logits of a full forward pass over the sequence so far."""
  model, params = _tiny_lm(0)
  seq = jnp.asarray(np.random.default_rng(0).integers(1, V, (3, 7)))
  start, step = gpt2_lib.lm_decoding_fns(model, params, seq[:, :4], 4)
  logits, state = jax.jit(start)()
  np.testing.assert_allclose(logits, _last_logits(model, params, seq[:, :4]), atol=1e-5)
  for t in range(1, 4):
    logits, state = jax.jit(step)(state, seq[:, 3 + t], t)
    np.testing.assert_allclose(logits, _last_logits(model, params, seq[:, :4 + t]), atol=1e-5)


@pytest.mark.parametrize("seed,min_length", [(0, 0), (1, 3), (2, 0)])
def test_greedy_equals_full_recompute_reference(seed, min_length):
  prompt = np.random.default_rng(seed).integers(1, V, (5, 3))
  model, params = _tiny_lm(seed, prompt)
  out = _decode(model, params, prompt, 8, min_length=min_length)
  want = _reference_greedy(model, params, prompt, 8, min_length)
  np.testing.assert_array_equal(out["tokens"], want)
  for r in range(5):
    ends = np.flatnonzero(want[r] == EOS)
    assert out["lengths"][r] == (ends[0] + 1 if len(ends) else 8)
    if min_length:
      assert out["lengths"][r] > min_length
    np.testing.assert_allclose(out["scores"][r], _score(model, params, prompt[r], want[r], 0.0),
                               rtol=1e-4)
  assert (out["tokens"] == EOS).any(), "the test should exercise finished rows"


@pytest.mark.parametrize("seed,k,lp,min_length", [(0, 3, 1.0, 0), (3, 2, 0.0, 2),
                                                   (4, 4, 0.6, 0)])
def test_beam_search_equals_full_recompute_reference(seed, k, lp, min_length):
  prompt = np.random.default_rng(seed).integers(1, V, (4, 3))
  model, params = _tiny_lm(seed, prompt)
  @jax.jit
  def run(params, prompt):
    start, step = gpt2_lib.lm_decoding_fns(model, params, prompt, 7)
    return generate.beam_search(start, step, beam_size=k, max_new_tokens=7, eos_id=EOS,
                                min_length=min_length, length_penalty=lp)
  out = jax.tree.map(np.asarray, run(params, jnp.asarray(prompt)))
  for r in range(4):
    score, toks = _reference_beam(model, params, prompt[r], k, 7, min_length, lp)
    np.testing.assert_array_equal(out["tokens"][r, :len(toks)], toks)
    assert out["lengths"][r] == len(toks)
    np.testing.assert_allclose(out["scores"][r], score, rtol=1e-4)
    # The reported score is the hypothesis's true score.
    np.testing.assert_allclose(out["scores"][r],
                               _score(model, params, prompt[r], toks, lp), rtol=1e-4)
    assert np.all(np.diff(out["beam_scores"][r]) <= 1e-6)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
@pytest.mark.parametrize("seed", range(4))
def test_beam_size_one_is_greedy(seed):
  prompt = np.random.default_rng(seed).integers(1, V, (6, 2))
  model, params = _tiny_lm(seed, prompt)
  g = _decode(model, params, prompt, 9)
  b = _decode(model, params, prompt, 9, beam_size=1)
  bs = jax.jit(lambda p, x: generate.beam_search(
      *gpt2_lib.lm_decoding_fns(model, p, x, 9), beam_size=1, max_new_tokens=9,
      eos_id=EOS, length_penalty=0.0))(params, jnp.asarray(prompt))
  np.testing.assert_array_equal(g["tokens"], b["tokens"])
  np.testing.assert_array_equal(g["tokens"], np.asarray(bs["tokens"]))
  np.testing.assert_array_equal(g["lengths"], np.asarray(bs["lengths"]))


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
@pytest.mark.parametrize("lp", [0.0, 1.0])
def test_beam_never_scores_below_greedy(lp):
  lost = 0
  for seed in range(6):
    prompt = np.random.default_rng(seed).integers(1, V, (8, 3))
    model, params = _tiny_lm(seed, prompt)
    g = _decode(model, params, prompt, 8, length_penalty=lp)
    b = _decode(model, params, prompt, 8, beam_size=4, length_penalty=lp)
    assert np.all(b["scores"] >= g["scores"] - 1e-5), (seed, b["scores"], g["scores"])
    # The returned score is the returned hypothesis's true score.
    for r in range(0, 8, 3):
      np.testing.assert_allclose(b["scores"][r], _score(model, params, prompt[r],
                                                        b["tokens"][r], lp), rtol=1e-4)
    raw = _decode(model, params, prompt, 8, beam_size=4, length_penalty=lp, guard_greedy=False)
    lost += int(np.sum(raw["scores"] < g["scores"] - 1e-5))
    np.testing.assert_array_equal(b["scores"], np.maximum(raw["scores"], g["scores"]))
  # Plain beam search does lose to greedy on these models (seed 1 at lp 0),
  # which is what the guard is for.
  if lp == 0.0:
    assert lost > 0


def test_one_compilation_per_shape():
  model, params = _tiny_lm(0)
  traces = []

  @functools.partial(jax.jit, static_argnums=2)
  def run(params, prompt, t_max):
    traces.append(1)
    start, step = gpt2_lib.lm_decoding_fns(model, params, prompt, t_max)
    return generate.generate(start, step, max_new_tokens=t_max, eos_id=EOS, beam_size=2)
  rng = np.random.default_rng(0)
  for _ in range(3):
    run(params, jnp.asarray(rng.integers(1, V, (2, 3))), 6)
  assert len(traces) == 1
  run(params, jnp.asarray(rng.integers(1, V, (3, 3))), 6)
  assert len(traces) == 2


def test_captioner_greedy_equals_teacher_forced_argmax():
  """Captioner decoding through the cache = argmax of full teacher-forced passes."""
  video = mbt.MBT(modalities="rgb", hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                  rgb_patch_size=(2, 8, 8))
  decoder = gpt2_lib.GPT2(vocab_size=V, max_positions=16, hidden_size=16, num_layers=2,
                          num_heads=2, mlp_dim=32)
  model = gpt2_lib.VideoCaptioner(video=video, decoder=decoder)
  rgb = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 16, 16, 3))
  variables = model.init(jax.random.PRNGKey(5), {"rgb": rgb}, jnp.zeros((3, 4), jnp.int32))
  variables = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, variables)
  t_max, bos, eos = 6, 1, 0

  @jax.jit
  def run(variables, rgb):
    start, step = gpt2_lib.captioner_decoding_fns(model, variables, {"rgb": rgb}, t_max, bos)
    return generate.greedy(start, step, max_new_tokens=t_max, eos_id=eos)
  out = np.asarray(run(variables, rgb)["tokens"])
  seq = np.full((3, 1), bos)
  teacher_forced = jax.jit(lambda v, x, ids: model.apply(v, {"rgb": x}, ids)[:, -1])
  for i in range(t_max):
    logits = teacher_forced(variables, rgb, jnp.asarray(seq))
    tok = np.asarray(jnp.argmax(logits, -1))
    done = (seq[:, 1:] == eos).any(axis=1)
    tok = np.where(done, eos, tok)
    np.testing.assert_array_equal(out[:, i], tok)
    seq = np.concatenate([seq, tok[:, None]], axis=1)
  assert math.isfinite(float(out.sum()))


def _table_decoder(probs0, table):
  """A hand-built decoder: p(token 0) = probs0, p(token t | token t-1 = j) = table[t][j]."""
  logp0 = jnp.log(jnp.asarray([probs0], jnp.float32))  # [1, V]
  logp = jnp.log(jnp.asarray(table, jnp.float32))  # [T, V, V]

  def start_fn():
    return logp0, {"rows": jnp.zeros((1, 1), jnp.float32)}

  def step_fn(state, tokens, t):
    return logp[t][tokens], state
  return start_fn, step_fn


def test_length_penalty_and_min_length_on_a_hand_built_model():
  """Scores computed by hand: the length penalty picks the longer caption, min_length
  bans the early EOS. Tokens: 0 = EOS, 1 = x, 2 = y."""
  uniform = [1 / 3] * 3
  table = [[uniform] * 3,
           [uniform, [0.6, 0.3, 0.1], [0.1, 0.05, 0.85]],   # t = 1, after EOS / x / y
           [uniform, [0.7, 0.2, 0.1], [0.9, 0.05, 0.05]]]   # t = 2
  start, step = _table_decoder([0.05, 0.55, 0.40], table)
  a = math.log(0.55) + math.log(0.6)                      # "x EOS"      -1.10866
  b = math.log(0.40) + math.log(0.85) + math.log(0.9)     # "y y EOS"    -1.18417
  d = math.log(0.55) + math.log(0.3) + math.log(0.7)      # "x x EOS"    -2.15848
  cases = [  # (beam_size, length_penalty, min_length) -> tokens, score
      ((1, 0.0, 0), [1, 0], a),
      ((1, 1.0, 0), [1, 0], a / 2),           # greedy: the penalty only rescales
      ((1, 0.0, 2), [1, 1, 0], d),             # EOS banned at token 1
      ((2, 0.0, 0), [1, 0], a),                # a > b: the plain sum keeps the short one
      ((2, 1.0, 0), [2, 2, 0], b / 3),         # b / 3 = -0.395 > a / 2 = -0.554
      ((2, 0.0, 2), [2, 2, 0], b),             # "x EOS" banned; b > d
  ]
  for (k, lp, min_length), tokens, score in cases:
    out = jax.jit(lambda k=k, lp=lp, m=min_length: generate.generate(
        start, step, max_new_tokens=3, eos_id=0, beam_size=k, length_penalty=lp,
        min_length=m))()
    n = len(tokens)
    np.testing.assert_array_equal(np.asarray(out["tokens"])[0, :n], tokens, err_msg=str((k, lp)))
    assert int(out["lengths"][0]) == n
    np.testing.assert_allclose(float(out["scores"][0]), score, rtol=1e-5)

"""Batched greedy and beam-search decoding, jitted whole, for every avtext decoder.

A decoder is two functions over a *state* (its KV cache and whatever else it
carries, e.g. encoder outputs):

  start_fn()                  -> (logits [B, V] of token 0, state)
  step_fn(state, tokens, t)   -> (logits [N, V] of token t, state):
                                 feeds token t-1 ([N] ids) at text position t

(`avtext.models.gpt2.lm_decoding_fns` / `captioner_decoding_fns` build them
for GPT-2 and VideoCC's captioner; `avtext.models.mmt` for MMT.) State leaves
are batch-major, [N, ...], or scalars (a cache index); beam search repeats
the [B, ...] leaves of `start_fn`'s state K times (N = B * K, beams of one
example adjacent) and reorders them as beams move. Shapes never change: the
loop is a `lax.while_loop` over a preallocated cache, so a jitted call
compiles once per (batch, max_new_tokens) and makes no host round-trip per
token.

Scoring, shared by both searches so they can be compared: a hypothesis of
tokens y_0 .. y_{n-1} (ending with EOS unless cut at max_new_tokens) scores
  sum_i log p(y_i | y_<i, input) / n ** length_penalty,
n counting the EOS (HF's `length_penalty` convention; 0 = plain sum,
> 0 favours longer captions). `min_length`: EOS gets probability zero while
fewer than min_length tokens precede it. Outputs are padded with EOS after a
hypothesis ends.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array
StartFn = Callable[[], tuple[Array, Any]]
StepFn = Callable[[Any, Array, Array], tuple[Array, Any]]

_NEG = -1e9  # "impossible": finite, so sums and comparisons stay well defined


def _log_probs(logits: Array, index: Array, eos_id: int, min_length: int) -> Array:
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  if min_length > 0:
    logp = logp.at[..., eos_id].set(jnp.where(index < min_length, _NEG, logp[..., eos_id]))
  return logp


def _normalize(logp_sum: Array, length: Array, length_penalty: float) -> Array:
  return logp_sum / jnp.maximum(length, 1).astype(jnp.float32) ** length_penalty


def _greedy_pick(i, logp: Array, carry: tuple, eos_id: int) -> tuple:
  """Greedy decoding's token i ([N] argmax of `logp` [N, V]) appended to its carry
  (tokens [N, T], done [N], logp_sum [N], lengths [N])."""
  tokens, done, logp_sum, lengths = carry
  tok = jnp.argmax(logp, axis=-1).astype(jnp.int32)
  tok = jnp.where(done, eos_id, tok)
  logp_sum = logp_sum + jnp.where(done, 0.0, jnp.take_along_axis(logp, tok[:, None], 1)[:, 0])
  lengths = jnp.where(done, lengths, i + 1)
  tokens = tokens.at[:, i].set(tok)
  return tokens, done | (tok == eos_id), logp_sum, lengths


def _greedy_start(b: int, t_max: int, eos_id: int) -> tuple:
  return (jnp.full((b, t_max), eos_id, jnp.int32), jnp.zeros((b,), bool),
          jnp.zeros((b,), jnp.float32), jnp.zeros((b,), jnp.int32))


def _greedy_out(carry: tuple, length_penalty: float) -> dict[str, Array]:
  tokens, _, logp_sum, lengths = carry
  return {"tokens": tokens, "lengths": lengths,
          "scores": _normalize(logp_sum, lengths, length_penalty)}


def greedy(start_fn: StartFn, step_fn: StepFn, *, max_new_tokens: int, eos_id: int,
           min_length: int = 0, length_penalty: float = 0.0) -> dict[str, Array]:
  """Argmax decoding of up to `max_new_tokens` tokens per example.

  Returns:
    tokens int32 [B, T] (EOS-padded), lengths int32 [B] (tokens including the
    EOS), scores float32 [B] (the module docstring's score).
  """
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  logits, state = start_fn()
  b = logits.shape[0]
  t_max = max_new_tokens

  def pick(i, logits, carry):
    return _greedy_pick(i, _log_probs(logits, i, eos_id, min_length), carry, eos_id)

  carry = pick(0, logits, _greedy_start(b, t_max, eos_id))

  def cond(c):
    i, (_, done, *_), _ = c
    return (i < t_max) & ~jnp.all(done)

  def body(c):
    i, carry, state = c
    logits, state = step_fn(state, carry[0][:, i - 1], i)
    return i + 1, pick(i, logits, carry), state

  _, carry, _ = jax.lax.while_loop(cond, body, (1, carry, state))
  return _greedy_out(carry, length_penalty)


def _gather_beams(tree: Any, origin: Array, batch: int, beams: int) -> Any:
  """Rows [B*K, ...] of every batch-major leaf reordered: beam k <- beam origin[b, k]."""
  rows = (jnp.arange(batch)[:, None] * beams + origin).reshape(batch * beams)

  def take(x):
    if x.ndim == 0 or x.shape[0] != batch * beams:
      return x
    # In bounds by construction: a plain row gather, without the masking of "fill".
    return x.at[rows].get(mode="promise_in_bounds")
  return jax.tree.map(take, tree)


def _repeat_beams(tree: Any, batch: int, beams: int) -> Any:
  def rep(x):
    if x.ndim == 0 or x.shape[0] != batch:
      return x
    return jnp.repeat(x, beams, axis=0)
  return jax.tree.map(rep, tree)


def beam_search(start_fn: StartFn, step_fn: StepFn, *, beam_size: int, max_new_tokens: int,
                eos_id: int, min_length: int = 0,
                length_penalty: float = 1.0) -> dict[str, Array]:
  """Beam search keeping `beam_size` live and `beam_size` finished hypotheses.

  Each step extends every live beam by every token, keeps the 2K best
  extensions by log-probability, moves those ending in EOS among the first K
  of them to the finished set (scored with the length penalty, best K kept;
  HF's rule) and continues the best K that did not end. An example stops when its worst finished score beats the best
  score any live beam could still reach (with length_penalty >= 0, its
  log-probability normalized by max_new_tokens); beams still live at
  max_new_tokens finish there. With beam_size=1 and length_penalty=0 this is
  greedy decoding.

  Returns:
    tokens [B, T], lengths [B], scores [B]: the best hypothesis;
    beams [B, K, T], beam_lengths [B, K], beam_scores [B, K]: all finished
    ones, best first.
  """
  return _beam_search(start_fn, step_fn, beam_size=beam_size, max_new_tokens=max_new_tokens,
                      eos_id=eos_id, min_length=min_length, length_penalty=length_penalty,
                      with_greedy=False)[0]


def _beam_search(start_fn: StartFn, step_fn: StepFn, *, beam_size: int, max_new_tokens: int,
                 eos_id: int, min_length: int, length_penalty: float,
                 with_greedy: bool) -> tuple[dict[str, Array], dict[str, Array] | None]:
  """`beam_search`; with_greedy also decodes greedily, as one more row per example
  beside its K beams in the same step_fn calls (a decode step's cost is mostly reading
  the weights, shared by all rows), and returns `greedy`'s outputs second."""
  if beam_size < 1 or max_new_tokens < 1:
    raise ValueError(f"beam_size and max_new_tokens must be >= 1, got {beam_size}, "
                     f"{max_new_tokens}")
  k, t_max = beam_size, max_new_tokens
  rows = k + 1 if with_greedy else k  # per example: the K beams [, the greedy row]
  logits, state = start_fn()
  b, v = logits.shape
  state = _repeat_beams(state, b, rows)
  logits = jnp.repeat(logits, rows, axis=0)
  pos = jnp.arange(t_max)

  def best_possible(alive_logp, i):
    # Future tokens only lower the log-probability; the longest hypothesis gets
    # the mildest normalization when length_penalty >= 0.
    n = t_max if length_penalty >= 0 else i + 2
    return jnp.max(alive_logp, axis=1) / float(n) ** length_penalty

  def advance(i, logits, c, g):
    alive_seq, alive_logp, fin_seq, fin_score, fin_len = c
    logp = _log_probs(logits, i, eos_id, min_length).reshape(b, rows, v)
    if with_greedy:
      g = _greedy_pick(i, logp[:, k], g, eos_id)
    cand = (alive_logp[:, :, None] + logp[:, :k]).reshape(b, k * v)
    cand_logp, cand_idx = jax.lax.top_k(cand, 2 * k)
    origin, tok = cand_idx // v, (cand_idx % v).astype(jnp.int32)
    seq = jnp.take_along_axis(alive_seq, origin[:, :, None], axis=1)
    seq = jnp.where(pos == i, tok[:, :, None], seq)
    is_eos = tok == eos_id
    # Finished: the old K and the new EOS extensions, best K by score.
    # As in HF's beam search, an EOS extension finishes only when it ranks among
    # the top K (so beam_size=1 takes the argmax path, like greedy).
    in_top_k = jnp.arange(2 * k) < k
    new_score = jnp.where(is_eos & in_top_k, _normalize(cand_logp, i + 1, length_penalty),
                          _NEG)
    all_score = jnp.concatenate([fin_score, new_score], axis=1)
    all_seq = jnp.concatenate([fin_seq, seq], axis=1)
    all_len = jnp.concatenate([fin_len, jnp.full((b, 2 * k), i + 1, jnp.int32)], axis=1)
    fin_score, top = jax.lax.top_k(all_score, k)
    fin_seq = jnp.take_along_axis(all_seq, top[:, :, None], axis=1)
    fin_len = jnp.take_along_axis(all_len, top, axis=1)
    # Alive: the best K extensions that did not end.
    alive_logp, top = jax.lax.top_k(jnp.where(is_eos, _NEG, cand_logp), k)
    alive_seq = jnp.take_along_axis(seq, top[:, :, None], axis=1)
    origin = jnp.take_along_axis(origin, top, axis=1)
    if with_greedy:  # the greedy row stays where it is
      origin = jnp.concatenate([origin, jnp.full((b, 1), k, origin.dtype)], axis=1)
    return (alive_seq, alive_logp, fin_seq, fin_score, fin_len), g, origin

  # Token 0: every beam holds the same prefix, so only beam 0 may expand.
  first_logp = jnp.tile(jnp.array([0.0] + [_NEG] * (k - 1), jnp.float32), (b, 1))
  c = (jnp.full((b, k, t_max), eos_id, jnp.int32), first_logp,
       jnp.full((b, k, t_max), eos_id, jnp.int32), jnp.full((b, k), _NEG, jnp.float32),
       jnp.zeros((b, k), jnp.int32))
  g = _greedy_start(b, t_max, eos_id) if with_greedy else ()
  c, g, origin = advance(0, logits, c, g)
  state = _gather_beams(state, origin, b, rows)

  def cond(loop):
    i, c, g, _ = loop
    _, alive_logp, _, fin_score, _ = c
    # Extra steps cannot change a finished example's beams (its best possible score
    # cannot beat its worst finished one), so the greedy row may run on after them.
    running = jnp.any(best_possible(alive_logp, i) > jnp.min(fin_score, axis=1))
    if with_greedy:
      running |= ~jnp.all(g[1])
    return (i < t_max) & running

  def body(loop):
    i, c, g, state = loop
    tokens = c[0][:, :, i - 1]
    if with_greedy:
      tokens = jnp.concatenate([tokens, g[0][:, i - 1, None]], axis=1)
    logits, state = step_fn(state, tokens.reshape(b * rows), i)
    c, g, origin = advance(i, logits, c, g)
    return i + 1, c, g, _gather_beams(state, origin, b, rows)

  _, c, g, _ = jax.lax.while_loop(cond, body, (1, c, g, state))
  alive_seq, alive_logp, fin_seq, fin_score, fin_len = c
  # Live beams at the end are cut at max_new_tokens (or provably worse than
  # every finished one when the loop stopped early).
  cut_score = jnp.where(alive_logp > _NEG / 2, _normalize(alive_logp, t_max, length_penalty),
                        _NEG)
  all_score = jnp.concatenate([fin_score, cut_score], axis=1)
  fin_score, top = jax.lax.top_k(all_score, k)
  fin_seq = jnp.take_along_axis(jnp.concatenate([fin_seq, alive_seq], 1), top[:, :, None], 1)
  fin_len = jnp.take_along_axis(
      jnp.concatenate([fin_len, jnp.full((b, k), t_max, jnp.int32)], 1), top, 1)
  out = {"tokens": fin_seq[:, 0], "lengths": fin_len[:, 0], "scores": fin_score[:, 0],
         "beams": fin_seq, "beam_lengths": fin_len, "beam_scores": fin_score}
  return out, (_greedy_out(g, length_penalty) if with_greedy else None)


def generate(start_fn: StartFn, step_fn: StepFn, *, max_new_tokens: int, eos_id: int,
             beam_size: int = 1, min_length: int = 0, length_penalty: float = 0.0,
             guard_greedy: bool = True) -> dict[str, Array]:
  """Greedy decoding when beam_size == 1, beam search otherwise; keys as `greedy`'s.

  Beam search can lose the greedy hypothesis (its prefix falls out of the K
  live beams, or its EOS ranks below K), and on random tiny models it then
  returns a lower score than greedy decoding. With `guard_greedy` (default)
  greedy decoding runs too, as a (K+1)-th row of each example in the beam search's own
  decode steps, and each example keeps the better of the two under the shared score,
  so beam search never scores below greedy.
  """
  kw = dict(max_new_tokens=max_new_tokens, eos_id=eos_id, min_length=min_length,
            length_penalty=length_penalty)
  if beam_size == 1:
    return greedy(start_fn, step_fn, **kw)
  out, g = _beam_search(start_fn, step_fn, beam_size=beam_size, with_greedy=guard_greedy,
                        **kw)
  out = {key: out[key] for key in ("tokens", "lengths", "scores")}
  if not guard_greedy:
    return out
  better = g["scores"] > out["scores"]
  return {key: jnp.where(better.reshape((-1,) + (1,) * (out[key].ndim - 1)), g[key], out[key])
          for key in out}


def from_config(gen, start_fn: StartFn, step_fn: StepFn, *, max_new_tokens: int,
                eos_id: int) -> dict[str, Array]:
  """`generate` with `config.generation`'s beam_size, min_length (default 0) and
  length_penalty (default 0.0): what the captioning tasks' predict functions decode with."""
  return generate(start_fn, step_fn, max_new_tokens=max_new_tokens, eos_id=eos_id,
                  beam_size=int(gen.beam_size), min_length=int(gen.get("min_length", 0)),
                  length_penalty=float(gen.get("length_penalty", 0.0)))

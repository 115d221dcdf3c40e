"""XML (TVR sec. 4): ConvSE and the modular query by hand, VCMR against a brute-force loop,
the corpus store, the tvr dataset and text features, and a tiny end-to-end run."""
import dataclasses
import itertools
import json
import math
import pathlib
import sys
import zipfile

from absl import flags
import h5py
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np
import pytest

from avtext import experiment
from avtext.data import builders
from avtext.data import coot_files
from avtext.data.builders import tvr
from avtext.features import tvr_text
from avtext.inference import vcmr
from avtext.metrics import vcmr as moment_metrics
from avtext.models import xml
from avtext.tasks import task_registry
from avtext.tasks import xml as moments_task
from avworld import longvideo
from avworld import tvr_layout
from avworld import world

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
sys.path.insert(0, str(CONFIGS))
import xml_tvr  # pylint: disable=g-import-not-at-top,wrong-import-position
from test_data_coot import ID, _hf_states, tiny_bert  # noqa: F401  (a fixture)  pylint: disable=g-import-not-at-top,wrong-import-position


# ---------------------------------------------------------------- model pieces by hand


def _tiny_xml(**kw):
  return xml.XML(**{**dict(hidden_size=4, num_heads=2, max_ctx_len=6, max_query_len=5), **kw})


def _inputs(rng, b=2, length=6, lq=5):
  q = jnp.asarray(rng.normal(size=(b, lq, 3)), jnp.float32)
  qm = jnp.asarray([[1, 1, 1, 0, 0]] * b, jnp.int32)
  ctx = {"video": jnp.asarray(rng.normal(size=(b, length, 5)), jnp.float32),
         "sub": jnp.asarray(rng.normal(size=(b, length, 3)), jnp.float32)}
  cm = jnp.asarray([[1] * length, [1] * 4 + [0] * (length - 4)], jnp.int32)
  return q, qm, ctx, cm


def test_convse_is_two_unbiased_same_padded_filters():
  conv = xml.ConvSE(kernel_size=3)
  s = jnp.asarray([[0.0, 1.0, 2.0, 0.0, 0.0]])
  params = {"start": {"kernel": jnp.asarray([-1.0, 0.0, 1.0]).reshape(3, 1, 1)},
            "end": {"kernel": jnp.asarray([1.0, 0.0, -1.0]).reshape(3, 1, 1)}}
  start, end = conv.apply({"params": params}, s)
  # start[l] = -s[l-1] + s[l+1] (zeros beyond the ends): an "up" edge detector.
  np.testing.assert_allclose(start, [[1.0, 2.0, -1.0, -2.0, 0.0]], atol=1e-6)
  np.testing.assert_allclose(end, -np.asarray([[1.0, 2.0, -1.0, -2.0, 0.0]]), atol=1e-6)
  v = conv.init(jax.random.PRNGKey(0), s)
  assert set(jax.tree.leaves(jax.tree.map(lambda x: x.shape, v))) == {3, 1}
  assert all(np.all(np.abs(k) <= 1 / math.sqrt(3)) for k in jax.tree.leaves(v))


def test_modular_query_is_a_masked_softmax_over_the_encoded_tokens():
  model = _tiny_xml()
  q, qm, ctx, cm = _inputs(np.random.default_rng(0))
  v = model.init(jax.random.PRNGKey(0), q, qm, ctx, cm)
  got = model.apply(v, q, qm, method=model.encode_query)  # [B, 2, D]
  # The encoded tokens H_q (same modules, applied by hand) and eq. 1.
  def hq(module):
    x = module.query_pos(module.query_proj(q, deterministic=True), deterministic=True)
    return module.query_encoder(x, qm, deterministic=True)
  h = np.asarray(model.apply(v, method=hq))
  w = np.asarray(v["params"]["modular"]["kernel"])  # [D, 2]: w_v, w_s
  for b in range(2):
    for m in range(2):
      logits = h[b, :3] @ w[:, m]  # the 3 real tokens only
      a = np.exp(logits - logits.max())
      a /= a.sum()
      np.testing.assert_allclose(got[b, m], a @ h[b, :3], rtol=1e-5, atol=1e-6)


def test_span_logits_are_convse_of_the_mean_stream_similarity():
  model = _tiny_xml(masked_convse=True)  # ours; the official default: the test below
  q, qm, ctx, cm = _inputs(np.random.default_rng(1))
  v = model.init(jax.random.PRNGKey(0), q, qm, ctx, cm)
  qv = model.apply(v, q, qm, method=model.encode_query)
  h0, h1 = model.apply(v, ctx, cm, method=model.encode_context)
  logits = model.apply(v, qv, h1, cm, method=model.span_logits)
  start, end = logits["start"], logits["end"]
  ks = {n: np.asarray(v["params"]["convse"][n]["kernel"])[:, 0, 0] for n in ("start", "end")}
  for b in range(2):
    n = int(cm[b].sum())
    sim = 0.5 * (np.asarray(h1[b, 0]) @ np.asarray(qv[b, 0])
                 + np.asarray(h1[b, 1]) @ np.asarray(qv[b, 1]))  # eq. 2
    sim[n:] = 0.0  # masked_convse: padded clips are zeroed before the filters
    padded = np.pad(sim, 2)
    for name, got in (("start", start), ("end", end)):
      want = np.asarray([padded[l:l + 5] @ ks[name] for l in range(6)])
      np.testing.assert_allclose(got[b, :n], want[:n], rtol=1e-5, atol=1e-5)
      assert np.all(np.asarray(got[b, n:]) == xml.NEG_INF)
  # The official per-stream Linear (configs/xml_tvr.py's default) maps q_m first.
  lin = _tiny_xml(span_query_linear=True, masked_convse=True)
  vl = lin.init(jax.random.PRNGKey(0), q, qm, ctx, cm)
  qv_l = lin.apply(vl, q, qm, method=lin.encode_query)
  _, h1_l = lin.apply(vl, ctx, cm, method=lin.encode_context)
  start_l = lin.apply(vl, qv_l, h1_l, cm, method=lin.span_logits)["start"]
  k_l = np.asarray(vl["params"]["convse"]["start"]["kernel"])[:, 0, 0]
  for b in range(2):
    n = int(cm[b].sum())
    proj = [np.asarray(qv_l[b, m]) @ np.asarray(vl["params"][f"{s}_span_query"]["kernel"])
            + np.asarray(vl["params"][f"{s}_span_query"]["bias"])
            for m, s in enumerate(("video", "sub"))]
    sim = 0.5 * (np.asarray(h1_l[b, 0]) @ proj[0] + np.asarray(h1_l[b, 1]) @ proj[1])
    sim[n:] = 0.0
    padded = np.pad(sim, 2)
    want = np.asarray([padded[l:l + 5] @ k_l for l in range(6)])
    np.testing.assert_allclose(start_l[b, :n], want[:n], rtol=1e-5, atol=1e-5)
  out = model.apply(v, q, qm, ctx, cm)
  # eq. 4 on H_0: mean over streams of the best cosine over real clips.
  for i, j in itertools.product(range(2), range(2)):
    n = int(cm[j].sum())
    want = np.mean([max(float(np.dot(h0[j, m, l], qv[i, m]) / np.linalg.norm(h0[j, m, l])
                            / np.linalg.norm(qv[i, m])) for l in range(n)) for m in range(2)])
    np.testing.assert_allclose(out["vr_scores"][i, j], want, rtol=1e-5)
  # A video's encodings do not depend on how far it is padded.
  short = {k: x[1:, :4] for k, x in ctx.items()}
  h0s, h1s = model.apply(v, short, cm[1:, :4], method=model.encode_context)
  np.testing.assert_allclose(h1s[0], h1[1, :, :4], rtol=1e-5, atol=1e-6)
  s2 = model.apply(v, qv[1:], h1s, cm[1:, :4], method=model.span_logits)["start"]
  np.testing.assert_allclose(s2[0], start[1, :4], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_train_loss_and_gradients_equal_the_plain_matmul_step():
  """`ops.dense_matmul` in the projections (kernel gradients in the faster orientation) and
  `ops.broadcast_leading` in the position tables give the same training loss and
  gradients as plain matmuls and broadcasts: the official default config (hash dropout
  on), feature widths above the hidden width (the wide-input path), videos of 3-10 real
  clips padded to 10, queries of 2-6 tokens."""
  from avtext.losses import xml as xml_losses  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  b, length, lq = 6, 10, 6
  model = xml.XML(hidden_size=8, num_heads=2, max_ctx_len=length, max_query_len=lq,
                  span_query_linear=True, dropout=xml.Dropout(masks="hash"))
  clips, tokens = rng.integers(3, length + 1, b), rng.integers(2, lq + 1, b)
  cm = jnp.asarray(np.arange(length)[None] < clips[:, None], jnp.int32)
  qm = jnp.asarray(np.arange(lq)[None] < tokens[:, None], jnp.int32)
  ctx = {"video": jnp.asarray(rng.normal(size=(b, length, 24)) * cm[..., None], jnp.float32),
         "sub": jnp.asarray(rng.normal(size=(b, length, 12)) * cm[..., None], jnp.float32)}
  q = jnp.asarray(rng.normal(size=(b, lq, 16)) * qm[..., None], jnp.float32)
  start = jnp.asarray(rng.integers(0, clips), jnp.int32)
  end = jnp.minimum(start + 1, jnp.asarray(clips - 1))
  # Random parameters (biases, LayerNorms and all), shaped without running init eagerly.
  shapes, tree = jax.tree.flatten(
      jax.eval_shape(model.init, jax.random.PRNGKey(0), q, qm, ctx, cm)["params"])
  params = jax.tree.unflatten(tree, [jnp.asarray(rng.normal(size=x.shape) * 0.3 + (x.ndim == 1),
                                                 jnp.float32) for x in shapes])

  def loss(params, model):
    out = model.apply({"params": params}, q, qm, ctx, cm, train=True,
                      rngs={"dropout": jax.random.PRNGKey(1)})
    neg_v, neg_q = xml_losses.sample_negatives(jax.random.PRNGKey(2), out["vr_scores"])
    return (xml_losses.video_retrieval_hinge(out["vr_scores"], neg_v, neg_q, margin=0.1)
            + 0.01 * xml_losses.svmr_nll(out["start"], out["end"], start, end, cm))

  # XLA's backend optimizations off: half the compile time, the same function.
  options = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
  step = lambda m: jax.jit(jax.value_and_grad(loss), static_argnums=1,  # noqa: E731
                           compiler_options=options)(params, m)
  barriers = lambda m: sum(e.primitive.name == "optimization_barrier"  # noqa: E731
                           for e in jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
                               params, m).jaxpr.eqns)
  ours = step(model)
  assert barriers(model) > 0  # the CPU forms are in the traced step
  # Built for a TPU: traced without them, plain products and broadcasts.
  on_tpu = model.clone(compute=dataclasses.replace(model.compute, backend="tpu"))
  assert barriers(on_tpu) == 0
  plain = step(on_tpu)
  assert float(ours[0]) > 0
  np.testing.assert_allclose(ours[0], plain[0], rtol=1e-6)
  flat = lambda t: dict(jax.tree_util.tree_leaves_with_path(t))  # noqa: E731
  got, want = flat(ours[1]), flat(plain[1])
  assert got.keys() == want.keys()
  for k in want:
    assert np.any(np.asarray(want[k]) != 0), k  # every parameter gets a gradient here
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=str(k))


def test_official_default_convse_reads_the_padded_clips():
  """Official: ConvSE filters S as computed at padded clips too (only the output is
  masked), and a padded position's cross-attention attends to every context position;
  so the last k//2 real clips' logits depend on the padded length."""
  model = _tiny_xml()
  assert not model.masked_convse and not model.variants.cross_output_linear
  q, qm, ctx, cm = _inputs(np.random.default_rng(2))
  v = model.init(jax.random.PRNGKey(0), q, qm, ctx, cm)
  assert "out" not in v["params"]["video_cross"]["cross_attention"]  # no Linear (official)
  qv = model.apply(v, q, qm, method=model.encode_query)
  _, h1 = model.apply(v, ctx, cm, method=model.encode_context)
  start = model.apply(v, qv, h1, cm, method=model.span_logits)["start"]
  k = np.asarray(v["params"]["convse"]["start"]["kernel"])[:, 0, 0]
  n = int(cm[1].sum())  # item 1: 4 real clips of 6
  sim = 0.5 * (np.asarray(h1[1, 0]) @ np.asarray(qv[1, 0])
               + np.asarray(h1[1, 1]) @ np.asarray(qv[1, 1]))  # raw at padded clips
  assert np.all(np.abs(sim[n:]) > 1e-6)
  want = np.asarray([np.pad(sim, 2)[l:l + 5] @ k for l in range(6)])
  np.testing.assert_allclose(start[1, :n], want[:n], rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(start[1, n:]) == xml.NEG_INF)

  # The cross-attention of a padded position: softmax over all 6 context positions.
  def cross_scores(module):
    x = {m: module.ctx_pos(module.ctx_proj[m](ctx[m], deterministic=True),
                           deterministic=True) for m in ("video", "sub")}
    h0 = {m: module.encoder0[m](x[m], cm, deterministic=True) for m in x}
    return h0, module.cross["video"](h0["video"], cm, context=h0["sub"], context_mask=cm,
                                     deterministic=True)
  (h0, crossed) = model.apply(v, method=cross_scores)
  p = v["params"]["video_cross"]["cross_attention"]
  hv, hs = np.asarray(h0["video"][1]), np.asarray(h0["sub"][1])
  proj = lambda x, n: np.einsum("ld,dhk->lhk", x, np.asarray(p[n]["kernel"])) + np.asarray(  # noqa: E731
      p[n]["bias"])
  qh, kh, vh = proj(hv, "query"), proj(hs, "key"), proj(hs, "value")
  logits = np.einsum("qhk,lhk->hql", qh, kh) / math.sqrt(2)
  logits[:, :n, n:] = -np.inf  # real rows: real keys only; padded rows: all keys
  a = np.exp(logits - logits.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  y = hv + np.einsum("hql,lhk->qhk", a, vh).reshape(6, 4)
  norm = v["params"]["video_cross"]["cross_attention_norm"]
  y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
  y = y * np.asarray(norm["scale"]) + np.asarray(norm["bias"])
  np.testing.assert_allclose(crossed[1], y, rtol=1e-4, atol=1e-5)

  # Hence the last k//2 = 2 real clips change with the padded length; the rest do not.
  short = {m: x[1:, :4] for m, x in ctx.items()}
  _, h1s = model.apply(v, short, cm[1:, :4], method=model.encode_context)
  s2 = model.apply(v, qv[1:], h1s, cm[1:, :4], method=model.span_logits)["start"]
  np.testing.assert_allclose(s2[0, :2], start[1, :2], rtol=1e-5, atol=1e-5)
  assert np.max(np.abs(np.asarray(s2[0, 2:4]) - np.asarray(start[1, 2:4]))) > 1e-6
  # Ours (cross_linear): the paper's Linear after cross-attention, the block's "out".
  lin = _tiny_xml(variants=xml.Variants(cross_output_linear=True))
  assert "out" in lin.init(jax.random.PRNGKey(0), q, qm, ctx, cm)["params"]["sub_cross"][
      "cross_attention"]


def test_clip_labels_inclusive_and_official():
  assert moments_task.clip_labels([3.2, 7.6], 10, 1.5) == (2, 5)  # clips 2..5 = 3.0-9.0 s
  assert moments_task.clip_labels([3.2, 7.6], 10, 1.5, "official") == (2, 6)
  assert moments_task.clip_labels([3.0, 4.5], 10, 1.5) == (2, 2)  # exactly one clip
  assert moments_task.clip_labels([40.0, 70.0], 30, 1.5) == (26, 29)  # cut to the video
  with pytest.raises(ValueError, match="end_label"):
    moments_task.clip_labels([0, 1], 2, 1.5, "exclusive")


# ---------------------------------------------------------------- VCMR vs brute force


def _toy_span_fn(params, q, h1, mask):
  """A deterministic stand-in for ConvSE: start = <q_0, h1_0>, end = <q_1, h1_1>."""
  del params
  start = jnp.einsum("...d,...ld->...l", q[..., 0, :], h1[..., 0, :, :])
  end = jnp.einsum("...d,...ld->...l", q[..., 1, :], h1[..., 1, :, :])
  return {"start": jnp.where(mask.astype(bool), start, -1e10),
          "end": jnp.where(mask.astype(bool), end, -1e10)}


def _store(tmp_path, rng, num_videos=7, length=6, dim=4, dtype="float32"):
  h0 = rng.normal(size=(num_videos, 2, length, dim)).astype(np.float32)
  h1 = rng.normal(size=(num_videos, 2, length, dim)).astype(np.float32)
  mask = np.zeros((num_videos, length), np.int32)
  for i in range(num_videos):
    mask[i, :rng.integers(3, length + 1)] = 1
  w = vcmr.CorpusWriter(tmp_path / dtype, num_videos=num_videos, streams=("video", "sub"),
                        dim=dim, max_len=length, dtype=dtype)
  w.add([f"v{i}" for i in range(4)], range(100, 104), h0[:4], h1[:4], mask[:4])
  w.add([f"v{i}" for i in range(4, num_videos)], range(104, 100 + num_videos), h0[4:], h1[4:],
        mask[4:])
  return w.close(), h0, h1, mask


def test_vcmr_equals_a_brute_force_loop_over_videos_and_spans(tmp_path):
  rng = np.random.default_rng(0)
  store, h0, h1, mask = _store(tmp_path, rng)
  q = rng.normal(size=(3, 2, 4)).astype(np.float32)
  cfg = vcmr.SearchConfig(top_n_videos=7, alpha=2.0, min_len=2, max_len=4, max_before_nms=40,
                          query_batch=2, video_chunk=3)
  out = vcmr.search(store, q, _toy_span_fn, cfg, own_video=[2, None, 5])
  for i in range(3):
    # eq. 4: mean over streams of the best cosine over real clips.
    svr = []
    for v in range(7):
      n = mask[v].sum()
      svr.append(np.mean([max(np.dot(h0[v, m, l], q[i, m]) / np.linalg.norm(h0[v, m, l])
                              / np.linalg.norm(q[i, m]) for l in range(n)) for m in range(2)]))
    order = sorted(range(7), key=lambda v: -svr[v])
    assert [r for r, _ in out["VR"][i]] == order
    np.testing.assert_allclose([s for _, s in out["VR"][i]], sorted(svr, reverse=True), rtol=1e-5)
    moments = []
    for v in range(7):
      n = mask[v].sum()
      st = np.exp(h1[v, 0, :n] @ q[i, 0]); st /= st.sum()
      ed = np.exp(h1[v, 1, :n] @ q[i, 1]); ed /= ed.sum()
      for a in range(6):
        for b in range(a, 6):
          if 2 <= b - a + 1 <= 4:  # the paper's length prior, padded clips have p = 0
            p = (st[a] if a < n else 0.0) * (ed[b] if b < n else 0.0)
            moments.append((p * math.exp(2.0 * svr[v]), v, a, b))
    moments.sort(key=lambda m: -m[0])
    got = out["VCMR"][i]
    assert len(got) == 40
    np.testing.assert_allclose([g[3] for g in got], [m[0] for m in moments[:40]], rtol=1e-4)
    top = [(m[1], m[2], m[3]) for m in moments[:10] if m[0] > moments[10][0] * (1 + 1e-4)]
    assert [tuple(g[:3]) for g in got[:len(top)]] == top
  assert out["SVMR"][1] is None and all(p[0] == 2 for p in out["SVMR"][0])
  sub = vcmr.submission(store, out, [{"desc_id": k, "desc": "x"} for k in range(3)], alpha=2.0)
  first = sub["VCMR"][0]["predictions"][0]
  v, a, b, s = out["VCMR"][0][0]
  assert first == [100 + v, a * 1.5, (b + 1) * 1.5, s]  # end inclusive: (end + 1) * 1.5 s
  assert sub["video2idx"] == {f"v{i}": 100 + i for i in range(7)}
  assert len(sub["SVMR"]) == 3 and sub["SVMR"][1]["predictions"] == []


def test_store_keeps_padded_h1_where_the_official_convse_reads_it(tmp_path):
  """Official default (masked_convse False): the evaluator keeps H_1 at padded clips, so
  the span logits over the store are the model's own (padded to max_ctx_len)."""
  import types  # pylint: disable=g-import-not-at-top
  from avtext.evals import vcmr as moments_eval  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  h0, h1 = (rng.normal(size=(2, 2, 6, 4)).astype(np.float32) for _ in range(2))
  mask = np.asarray([[1] * 6, [1] * 4 + [0] * 2], np.int32)
  for keep in (False, True):
    w = vcmr.CorpusWriter(tmp_path / str(keep), num_videos=2, streams=("video", "sub"), dim=4,
                          max_len=6, keep_padded_h1=keep)
    w.add(["a", "b"], [0, 1], h0, h1, mask)
    got = w.close().read("h1", slice(0, 2))
    np.testing.assert_array_equal(got, h1 if keep else h1 * mask[:, None, :, None])
  reads = lambda variant: moments_eval.VCMREvaluator._convse_reads_padding(  # noqa: E731  pylint: disable=protected-access
      types.SimpleNamespace(task=types.SimpleNamespace(config=xml_tvr.get_config(variant))))
  assert reads("tiny") and not reads("tiny,masked_convse") and not reads("tiny,sliding")


def test_sliding_windows_average_clip_scores():
  from avtext.inference import spans  # pylint: disable=g-import-not-at-top
  x = jnp.asarray([0.1, 0.9, 0.8, 0.2, 0.6])
  band = np.asarray(spans.window_means(x, min_len=2, max_len=3))  # [start, length 2 | 3]
  want = [[0.5, 0.6], [0.85, 0.6333333], [0.5, 0.5333333], [0.4, -np.inf], [-np.inf, -np.inf]]
  np.testing.assert_allclose(band, want, rtol=1e-6)
  st, ed, sc = spans.top_windows(x, min_len=2, max_len=3, k=3)
  assert list(zip(np.asarray(st), np.asarray(ed))) == [(1, 2), (1, 3), (0, 2)]
  # In VCMR the window mean replaces P_st P_ed: a brute-force loop over a tiny corpus.
  rng = np.random.default_rng(5)
  clip = jax.nn.sigmoid(jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32))
  vr = jnp.asarray(rng.uniform(-1, 1, size=(2, 3)), jnp.float32)
  vid, st, ed, sc = spans.vcmr_window_scores(vr, clip, top_n_videos=3, alpha=2.0, min_len=2,
                                             max_len=4, k=5)
  for q in range(2):
    brute = sorted(((float(np.mean(clip[q, v, a:b + 1])) * math.exp(2.0 * float(vr[q, v])),
                     v, a, b) for v in range(3) for a in range(6) for b in range(a + 1, 6)
                    if b - a + 1 <= 4), reverse=True)[:5]
    np.testing.assert_allclose(np.asarray(sc[q]), [m[0] for m in brute], rtol=1e-5)
    assert [(int(v), int(a), int(b)) for v, a, b in zip(vid[q], st[q], ed[q])] == [
        m[1:] for m in brute]


def test_reduced_precision_stores_keep_the_ranking(tmp_path):
  rng = np.random.default_rng(3)
  ref, *_ = _store(tmp_path, rng, num_videos=40, length=8, dim=32)
  q = rng.normal(size=(5, 2, 32)).astype(np.float32)
  s32, i32 = vcmr.video_retrieval(ref, q, 10)
  for dtype, tol in (("bfloat16", 2e-2), ("int8", 2e-2)):
    store, *_ = _store(tmp_path, np.random.default_rng(3), num_videos=40, length=8, dim=32,
                       dtype=dtype)
    s, i = vcmr.video_retrieval(store, q, 10)
    np.testing.assert_allclose(s, s32, atol=tol)
    assert np.mean([len(set(a[:5]) & set(b[:5])) / 5 for a, b in zip(i, i32)]) >= 0.8
    # bfloat16 GEMM operands: the stored values are exact in bf16, only the query rounds.
    s16, i16 = vcmr.video_retrieval(store, q, 10, compute_dtype="bfloat16")
    np.testing.assert_allclose(s16, s, atol=1e-2)
    assert np.mean([len(set(a[:5]) & set(b[:5])) / 5 for a, b in zip(i16, i)]) >= 0.8
  # The blocked scan equals one GEMM: chunks of 12 videos, 3 per GEMM, a tail of 4
  # padded to 6; then the default chunking.
  s, i = vcmr.video_retrieval(ref, q, 10, video_chunk=14, block=3)
  np.testing.assert_allclose(s, s32, rtol=1e-5)
  np.testing.assert_array_equal(i, i32)
  s, i = vcmr.video_retrieval(ref, q, 10, video_chunk=10, block=4)
  np.testing.assert_allclose(s, s32, rtol=1e-5)
  np.testing.assert_array_equal(i, i32)
  with pytest.raises(ValueError, match="compute_dtype"):
    vcmr.video_retrieval(ref, q, 10, compute_dtype="float16")
  cand = np.tile(np.arange(0, 40, 2), (5, 1))  # restricting to candidates: their exact order
  s, i = vcmr.video_retrieval(ref, q, 5, candidates=cand)
  full = vcmr.chunk_video_scores(vcmr.l2_normalize(q), ref.h["h0"][:])
  for row in range(5):
    best = sorted(range(0, 40, 2), key=lambda v: -full[row, v])[:5]
    assert list(i[row]) == best


def test_clip_index_candidates_are_the_owners_of_the_nearest_clips(tmp_path):
  from avtext.inference import ann  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  store, h0, _, mask = _store(tmp_path, rng, num_videos=50, length=6, dim=16)
  index = ann.ClipIndex.build(store, nlist=4)
  assert [ix.ntotal for ix in index.indexes] == [mask.sum()] * 2  # padding is not indexed
  q = rng.normal(size=(4, 2, 16)).astype(np.float32)
  cand = index.candidates(q, clips_per_stream=10, nprobe=4)  # every list probed
  hn = h0 / np.linalg.norm(h0, axis=-1, keepdims=True)
  qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
  for i in range(4):
    got = set(cand[i][cand[i] >= 0].tolist())
    for s in range(2):
      near = sorted(((float(hn[v, s, l] @ qn[i, s]), v) for v in range(50) for l in range(6)
                     if mask[v, l]), reverse=True)
      assert {v for _, v in near[:3]} <= got  # SQ8 codes: only near-ties may swap
      assert len({v for _, v in near[:10]} & got) >= 0.8 * len({v for _, v in near[:10]})
    assert len(got) <= 20
  # VR restricted to the candidates: their exact eq. 4 scores, best first.
  s, i = vcmr.video_retrieval(store, q, 5, candidates=cand)
  full = vcmr.chunk_video_scores(qn, store.h["h0"][:])
  for row in range(4):
    rows = cand[row][cand[row] >= 0]
    best = rows[np.argsort(-full[row, rows], kind="stable")][:5]
    np.testing.assert_array_equal(i[row], best)
    np.testing.assert_allclose(s[row], full[row, best], rtol=1e-5)


# ---------------------------------------------------------------- data


def test_pool_subtitles_max_over_touching_lines():
  a, b = np.asarray([[1.0, -2.0], [0.0, 5.0]]), np.asarray([[3.0, 1.0]])
  pooled, mask = tvr_text.pool_subtitles([(0.2, 2.0, a), (2.9, 3.1, b)], 4, 1.5, 2)
  # a covers clips floor(0.2/1.5)=0 .. ceil(2.0/1.5)-1=1; b covers 1..2; clip 3 has none.
  np.testing.assert_allclose(pooled, [[1, 5], [3, 5], [3, 1], [0, 0]])
  np.testing.assert_array_equal(mask, [1, 1, 1, 0])


def write_synthetic_tvr(path: pathlib.Path, *, num=(10, 4, 4), dims=(8, 6, 6), seed=0):
  """The TVR layout of the synthetic long videos with random features (no tower, no BERT)."""
  spec = world.WorldSpec(height=32, width=32)
  clip_ids, desc_ids = iter(range(10**6)), iter(range(10**6))
  rng = np.random.default_rng(seed)
  videos, subs, queries, index = {}, {}, {}, {}
  for (name, split), n in zip(tvr_layout.SPLITS, num):
    src = longvideo.LongVideoSource(split, num_examples=n, spec=spec)
    _, rows, _ = tvr_layout.annotations(src, range(n), clip_ids, desc_ids,
                                        all_queries=split == "train")
    (tvr.annotation_path(path, name)).write_text("".join(json.dumps(r) + "\n" for r in rows))
    index[name] = {}
    for i in range(n):
      vid = src.video_id(i)
      index[name][vid] = [src.describe(i)["duration_s"], len(videos)]
      videos[vid] = rng.normal(size=(src.num_clips(i), dims[0]))
      subs[vid] = rng.normal(size=(src.num_clips(i), dims[1]))
    queries.update({str(r["desc_id"]): rng.normal(size=(rng.integers(3, 9), dims[2]))
                    for r in rows})
  coot_files.write_video_features_h5(path / "video_feature", tvr_layout.VIDEO_FEATURES,
                                         videos)
  coot_files.write_h5(path / tvr.DEFAULT_SUB_FEATURES, subs)
  coot_files.write_h5(path / tvr.DEFAULT_QUERY_FEATURES, queries)
  coot_files.write_json(path / tvr.VIDEO2IDX, index)
  return path


@pytest.fixture(scope="module")
def tvr_dir(tmp_path_factory):
  return write_synthetic_tvr(tmp_path_factory.mktemp("tvr"))


def _dataset_config(path, **kw):
  return ml_collections.ConfigDict({**dict(
      name="tvr", path=str(path), video_features=(tvr_layout.VIDEO_FEATURES,),
      sub_features=tvr.DEFAULT_SUB_FEATURES, query_features=tvr.DEFAULT_QUERY_FEATURES,
      video_dim=8, sub_dim=6, query_dim=6), **kw})


def test_tvr_source_reads_the_official_layout(tvr_dir):
  src = builders.get_source(_dataset_config(tvr_dir), "val")
  rows = [json.loads(l) for l in tvr.annotation_path(tvr_dir, "val").read_text().splitlines()]
  assert len(src) == len(rows) == 12  # one query per moment, 3 moments per video
  item = src[5]
  assert item["desc_id"] == rows[5]["desc_id"] and item["type"] in ("v", "t", "vt")
  with h5py.File(tvr_dir / tvr.DEFAULT_QUERY_FEATURES) as h5:
    raw = np.asarray(h5[str(rows[5]["desc_id"])])
  np.testing.assert_allclose(item["query"], raw / (np.linalg.norm(raw, axis=1, keepdims=True)
                                                   + 1e-5), rtol=1e-6)
  ctx = src.context(rows[5]["vid_name"])
  assert ctx["video"].shape[0] == ctx["sub"].shape[0]
  np.testing.assert_allclose(np.linalg.norm(ctx["sub"], axis=1), 1.0, atol=1e-4)
  assert [v for v, _ in src.corpus] == list(json.loads(
      (tvr_dir / tvr.VIDEO2IDX).read_text())["val"])
  train = builders.get_source(_dataset_config(tvr_dir), "train")
  assert len(train) == 10 * 3 * 2  # every description of a training moment is a query


def test_tvr_source_errors_name_the_file_and_field(tvr_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  bad = tmp_path / "bad"
  shutil.copytree(tvr_dir, bad)
  rows = tvr.annotation_path(bad, "val").read_text().splitlines()
  row = json.loads(rows[2])
  row["ts"] = [5.0, 1.0]
  rows[2] = json.dumps(row)
  tvr.annotation_path(bad, "val").write_text("\n".join(rows) + "\n")
  with pytest.raises(ValueError, match=r"tvr_val_release.jsonl, line 3: ts must be"):
    builders.get_source(_dataset_config(bad), "val")
  with pytest.raises(ValueError, match=r"config.dataset.video_dim=9: the features in .* "
                     r"are 8-d; set --config.dataset.video_dim=8, or"):
    builders.get_source(_dataset_config(tvr_dir, video_dim=9), "test_public")
  with pytest.raises(FileNotFoundError, match=r"query features .*nope.h5 not found"):
    builders.get_source(_dataset_config(tvr_dir, query_features="nope.h5"), "val")


# ---------------------------------------------------------------- end to end


@pytest.mark.slow  # default-run budget (BENCHMARKS.md, "Default test run"); `make test-slow`
def test_tiny_xml_run_writes_a_submission_scored_like_the_official_eval(tvr_dir, tmp_path):
  config = xml_tvr.get_config("tiny")
  config.dataset = _dataset_config(tvr_dir)
  config.model.max_ctx_len = 40
  config.evals.val.every_steps = 3
  workdir = tmp_path / "run"
  experiment.build(config, str(workdir)).train()
  results = json.loads((workdir / "results.json").read_text())
  sub_path = workdir / "moments" / "test_step6.json"
  sub = json.loads(sub_path.read_text())
  want = moment_metrics.evaluate_predictions(
      sub, tvr.annotation_path(tvr_dir, "test_public"))
  for task, key in (("VCMR", "0.5-r5"), ("VCMR", "0.7-r100"), ("SVMR", "0.5-r1"),
                    ("VR", "r10")):
    assert results["6"][f"test/{task}/{key}"] == want[task][key]
  assert set(sub) == {"video2idx", "VCMR", "SVMR", "VR"}
  assert all(len(q["predictions"]) <= 100 for q in sub["VCMR"])
  assert "test/random/VCMR/0.5-r1" in results["6"]
  assert results["best"]["step"] in (3, 6)  # selected on val VCMR R@1 sum
  stored = vcmr.CorpusStore(workdir / "corpus" / "test_step6")
  assert len(stored) == 4 and stored.streams == ("video", "sub")


@pytest.fixture(scope="module")
def early_stopped_run(tvr_dir, tmp_path_factory):
  """(config, workdir, results) of a tiny XML run that early-stops at step 3 of 6."""
  tmp_path = tmp_path_factory.mktemp("early_stopped")
  config = xml_tvr.get_config("tiny")
  config.dataset = _dataset_config(tvr_dir)
  config.model.max_ctx_len = 40
  config.train.num_steps = 6
  config.evals.val.every_steps = 1
  # A metric that never changes: step 1 is the best, steps 2 and 3 are stale, and with
  # patience 1 the run stops at 3 of 6, whatever the model learns.
  config.eval.select = ("val/num_queries", "max")
  config.eval.early_stopping_patience = 1
  workdir = tmp_path / "run"
  state = experiment.build(config, str(workdir)).train()
  return config, workdir, state, json.loads((workdir / "results.json").read_text())


def test_early_stopped_xml_run_writes_the_test_submission(early_stopped_run):
  config, workdir, state, results = early_stopped_run
  assert bool(state.control.stopped) and int(state.step) == 3
  # Every evaluator ran at the last step, as in a re-run of the finished run.
  assert {key.split("/")[0] for key in results["3"]} == set(config.evals) == {"val", "test"}
  sub_path = workdir / "moments" / "test_step3.json"
  assert results["3"]["test/submission"] == str(sub_path)
  assert set(json.loads(sub_path.read_text())) == {"video2idx", "VCMR", "SVMR", "VR"}
  # The last evaluation wrote val's and test_public's: both, under the official names, and
  # the zip to upload (TVRetrieval standalone_eval/README.md); test_public without SVMR.
  folder = workdir / "submission" / "step3"
  assert results["3"]["test/upload"] == str(folder / "tvr_submission.zip")
  assert results["1"]["val/upload"] == ""  # val alone at steps 1 and 2: nothing to upload
  with zipfile.ZipFile(folder / "tvr_submission.zip") as archive:
    assert sorted(archive.namelist()) == ["tvr_test_public_submission.json",
                                          "tvr_val_submission.json"]
    val = json.loads(archive.read("tvr_val_submission.json"))
    test = json.loads(archive.read("tvr_test_public_submission.json"))
  assert val == json.loads((workdir / "moments" / "val_step3.json").read_text())
  assert test == {k: v for k, v in json.loads(sub_path.read_text()).items() if k != "SVMR"}
  assert json.loads((folder / "tvr_test_public_submission.json").read_text()) == test


@pytest.mark.slow  # ~25 s; the import itself is tested by tests/test_weights_official_xml.py
def test_early_stopped_xml_run_imports_evaluates_and_continues(early_stopped_run, tmp_path):
  """The trained weights written as an official TVR checkpoint (state dict + model_cfg,
  .npz), imported, and evaluated with --mode=eval: the same numbers as the run itself."""
  config, workdir, _, results = early_stopped_run
  config = ml_collections.ConfigDict(config.to_dict())  # the fixture's stays as it ran
  from avtext import runs  # pylint: disable=g-import-not-at-top
  from avtext import import_checkpoint as import_tool  # pylint: disable=g-import-not-at-top
  from avtext.weights import official  # pylint: disable=g-import-not-at-top
  from avtext.weights import official_xml  # pylint: disable=g-import-not-at-top
  run = runs.load_run(workdir, step=3)
  m = config.model
  official.save_npz(tmp_path / "model.npz", official_xml.to_official(run.params),
                    {"model_cfg": {"hidden_size": m.hidden_size, "n_heads": m.num_heads,
                                   "max_ctx_l": m.max_ctx_len, "max_desc_l": m.max_query_len,
                                   "ctx_mode": "video_sub"}})
  imported = import_tool.import_checkpoint("xml", tmp_path / "model.npz", tmp_path / "imported",
                                        config)
  again = experiment.build(config, str(imported)).evaluate(
      eval_dir=tmp_path / "eval")
  for key in ("test/VCMR/0.5-r1", "test/VCMR/0.7-r5", "test/SVMR/0.5-r1", "test/VR/r5",
              "val/VR/r1"):
    assert again[key] == results["3"][key], key
  # Training continues from the imported step 0 (a fresh data order, no data state).
  config.train.num_steps, config.eval.early_stopping_patience = 1, None
  state = experiment.build(config, str(imported)).train()
  assert int(state.step) == 1
  assert json.loads((imported / "results.json").read_text())["1"]["val/num_queries"] > 0


def test_default_config_says_what_to_prepare():
  config = xml_tvr.get_config()
  assert (config.model.hidden_size, config.model.max_ctx_len, config.loss.span_weight,
          config.train.batch_size) == (256, 100, 0.01, 128)
  with pytest.raises(ValueError, match=r"config.dataset.path is not set: the TVR directory"):
    task_registry.build_task(config).num_train_examples()


@pytest.mark.parametrize("config", ["xml_tvr.py:tiny", "xml_tvr.py:demo", "mmt_tvc.py:tiny"])
def test_early_stopping_off_in_a_variant_is_still_set_from_the_flags(config, monkeypatch):
  argv = ["main", f"--config={CONFIGS / config}", "--config.eval.early_stopping_patience=2"]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags reads its overrides from sys.argv
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
  values(argv)
  assert values.config.eval.early_stopping_patience == 2

def test_text_features_tool_writes_layer_states_without_special_tokens(tiny_bert, tmp_path):
  directory, model = tiny_bert
  rows = [{"desc_id": 7, "desc": "The dog runs", "type": "v", "vid_name": "a", "duration": 6.0,
           "ts": [0.0, 3.0]}, {"desc_id": 9, "desc": "A man sits", "type": "t",
                               "vid_name": "a", "duration": 6.0, "ts": [1.5, 4.5]}]
  tvr.annotation_path(tmp_path, "val").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "tvqa_preprocessed_subtitles.jsonl").write_text(json.dumps(
      {"vid_name": "a", "sub": [{"text": "the dog", "start": 0.2, "end": 2.0},
                                {"text": "he walks", "start": 4.6, "end": 5.9}]}) + "\n")
  coot_files.write_video_features_h5(tmp_path / "video_feature", "v", {"a": np.ones((4, 3))})
  q_file, s_file = tvr_text.write(tmp_path, bert_dir=str(directory), layer=-2,
                                  video_features="v")
  seqs = {"q7": ["[CLS]", "the", "dog", "run", "##s", "[SEP]"],
          "q9": ["[CLS]", "a", "man", "sit", "##s", "[SEP]"],
          "l0": ["[CLS]", "the", "dog", "[SEP]"], "l1": ["[CLS]", "he", "walk", "##s", "[SEP]"]}
  states = dict(zip(seqs, _hf_states(model, [[ID[t] for t in s] for s in seqs.values()])))
  layer = lambda k: states[k][1:-1, 8:16]  # noqa: E731  hidden state -2 of 0, 1, 2
  with h5py.File(q_file) as h5:
    np.testing.assert_allclose(h5["7"], layer("q7"), atol=2e-5)
    np.testing.assert_allclose(h5["9"], layer("q9"), atol=2e-5)
  with h5py.File(s_file) as h5:
    sub, mask = np.asarray(h5["a"]), np.asarray(h5["a-mask"])
  # line 0 covers clips 0..1, line 1 clips 3..3 (floor(4.6/1.5)=3, ceil(5.9/1.5)-1=3)
  np.testing.assert_array_equal(mask, [1, 1, 0, 1])
  np.testing.assert_allclose(sub[0], layer("l0").max(0), atol=2e-5)
  np.testing.assert_allclose(sub[1], layer("l0").max(0), atol=2e-5)
  np.testing.assert_allclose(sub[2], 0.0)
  np.testing.assert_allclose(sub[3], layer("l1").max(0), atol=2e-5)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_encode_text_encodes_a_query_as_the_features_tool_wrote_it(tiny_bert, tmp_path):
  """`avtext.search_moments`' query encoder: the task's `encode_text` of a text is
  `encode_query` of the features the tool wrote for it, read as the tvr source reads them
  (L2-normalized), and it counts the wordpieces the model does not see."""
  directory, _ = tiny_bert
  texts = {"7": "The dog runs", "9": "A man sits fast"}  # 4 and 5 wordpieces
  tvr.annotation_path(tmp_path, "val").write_text("".join(json.dumps(
      {"desc_id": int(k), "desc": t, "type": "v", "vid_name": "a", "duration": 6.0,
       "ts": [0.0, 3.0]}) + "\n" for k, t in texts.items()))
  (tmp_path / "tvqa_preprocessed_subtitles.jsonl").write_text(json.dumps(
      {"vid_name": "a", "sub": [{"text": "the dog", "start": 0.2, "end": 2.0}]}) + "\n")
  coot_files.write_video_features_h5(tmp_path / "video_feature", "v", {"a": np.ones((4, 3))})
  q_file, _ = tvr_text.write(tmp_path, bert_dir=str(directory), layer=-2, video_features="v")
  config = xml_tvr.get_config("tiny")
  config.dataset.query_encoder = dict(bert_dir=str(directory), layer=-2)
  config.dataset.query_dim, config.dataset.video_dim, config.dataset.sub_dim = 8, 3, 8
  config.model.max_query_len = 4
  task = task_registry.build_task(config)
  batch = {k: np.zeros((1,) + s.shape, s.dtype)
           for k, s in task.example_spec(train=True).items()}
  variables = task.init_variables(jax.random.PRNGKey(0), batch)
  fns = task.predict_fns()
  out = fns["encode_text"](variables, {"text": list(texts.values())})
  with h5py.File(q_file) as h5:
    rows = [task.query_example({"query": tvr.l2_normalize(np.asarray(h5[k]))}) for k in texts]
  want = fns["encode_query"](variables, {k: np.stack([r[k] for r in rows])
                                         for k in ("query", "query_mask")})["q"]
  np.testing.assert_allclose(out["q"], want, atol=1e-5)
  assert out["tokens"].tolist() == [4, 5] and out["kept"].tolist() == [4, 4]

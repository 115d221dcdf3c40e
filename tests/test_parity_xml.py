r"""XML parity: the official TVR XML (jayleicn/TVRetrieval) against its import into avtext.

    make test-parity    # the bench venv; checkouts under $AVTEXT_OFFICIAL (common/official.py)

Marked `needs_torch`: the default `make test` deselects it; it skips, saying why, where
torch or the checkout of jayleicn/TVRetrieval is missing. Steps:

1. The official model as train.py builds it (`XML(model_config)`, video_sub with
   cross-attention, merged streams, ConvSE), small widths (hidden 64, 4 heads, k = 5)
   so it runs in seconds on a CPU. Its init is re-drawn so that a wrong mapping would
   show: every Linear / Embedding weight N(0, 0.1) (the official 0.02 leaves the
   attention almost uniform), every bias and LayerNorm shift N(0, 0.1), every LayerNorm
   scale 1 + N(0, 0.1); the ConvSE filters keep PyTorch's default. eval(), float32.
2. Saved as train.py saves it, torch.save({"model": state_dict, "model_cfg":
   model.config (the EasyDict), "epoch": ...}), imported with
   `avtext.import_checkpoint.import_checkpoint("xml", ...)` onto
   configs/xml_tvr.py:tiny (feature widths set to the official model's), opened with
   `avtext.runs.load_run`.
3. One batch of 4 (query, video) pairs of different lengths (clips 11, 8, 6, 9; tokens
   8, 5, 3, 6), zero-padded to the batch's longest as the official collate does
   (utils.tensor_utils.pad_sequences_1d), fed to both. Compared: the encoded query
   tokens, the modular queries (eq. 1), H_0 and the cross-encoder outputs and H_1 of
   both streams (every position, padded ones too: ConvSE reads them), the eq. 2
   similarity S, the VR scores (eq. 4), the start/end logits, and the training loss
   of one step: official `model(**inputs)` (lw_st_ed 0.01, hard negatives with a pool
   of 1, which makes its sampled negative the hardest, deterministic) against
   avtext's `XMLTask.loss_fn` on the same batch (hard pool 1 from epoch 0; model
   dropout 0, since the official loss here runs in eval mode).

No shims: the official modules import with torch and easydict (requirements-bench.txt).
The table is printed (`pytest -s`); the test fails if a row is outside its tolerance.
"""
import pathlib

import numpy as np
import pytest

from benchmarks import common
from benchmarks.common import official

pytestmark = pytest.mark.needs_torch

DIMS = dict(video=20, sub=12, query=10)
HIDDEN, HEADS, MAX_CTX, MAX_Q, KERNEL = 64, 4, 12, 8, 5
CLIPS, TOKENS = (11, 8, 6, 9), (8, 5, 3, 6)


def _official_model(official_dir: pathlib.Path, seed: int):
  """The official model at the small widths, its init re-drawn (module docstring, 1.)."""
  import torch  # pylint: disable=g-import-not-at-top
  model = official.xml_model(official_dir, official.xml_model_config(
      visual_input_size=DIMS["video"], sub_input_size=DIMS["sub"],
      query_input_size=DIMS["query"], hidden_size=HIDDEN, conv_kernel_size=KERNEL,
      max_ctx_l=MAX_CTX, max_desc_l=MAX_Q, n_heads=HEADS, hard_pool_size=1), seed)
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        module.weight.normal_(0.0, 0.1)
        if getattr(module, "bias", None) is not None:
          module.bias.normal_(0.0, 0.1)
      elif isinstance(module, torch.nn.LayerNorm):
        module.weight.normal_(1.0, 0.1)
        module.bias.normal_(0.0, 0.1)
  model.eval()
  return model


def _batch(seed: int):
  rng = np.random.default_rng(seed)
  items = []
  for clips, tokens in zip(CLIPS, TOKENS):
    length = int(rng.integers(1, 5))
    st = int(rng.integers(0, clips - length + 1))
    items.append(dict(video=rng.standard_normal((clips, DIMS["video"])).astype(np.float32),
                      sub=rng.standard_normal((clips, DIMS["sub"])).astype(np.float32),
                      query=rng.standard_normal((tokens, DIMS["query"])).astype(np.float32),
                      st=st, ed=st + length - 1))
  return items


def _config():
  config = common.load_config("configs/xml_tvr.py:tiny")
  config.dataset.video_dim, config.dataset.sub_dim = DIMS["video"], DIMS["sub"]
  config.dataset.query_dim = DIMS["query"]
  return config


def run(official_dir: pathlib.Path, seed: int = 0):
  """(rows, extra lines) of the parity table."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _official_model(official_dir, seed)
  from utils.tensor_utils import pad_sequences_1d  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  loaded = official.xml_import(model, _config())
  ours, variables = loaded.model, {"params": loaded.params}

  items = _batch(seed)
  feats = {}
  for k in ("query", "video", "sub"):
    feats[k], feats[k + "_mask"] = pad_sequences_1d(
        [torch.from_numpy(it[k]) for it in items], dtype=torch.float32)
  st_ed = torch.tensor([[it["st"], it["ed"]] for it in items], dtype=torch.long)

  # ------------------------------------------------------------ official
  with torch.no_grad():
    qf, qm = feats["query"], feats["query_mask"]
    vf, vm, sf, sm = feats["video"], feats["video_mask"], feats["sub"], feats["sub_mask"]
    enc_q = model.encode_input(qf, qm, model.query_input_proj, model.query_encoder,
                               model.query_pos_embed)
    video_q, sub_q = model.get_modularized_queries(enc_q, qm)
    v1 = model.encode_input(vf, vm, model.video_input_proj, model.video_encoder1,
                            model.ctx_pos_embed)
    s1 = model.encode_input(sf, sm, model.sub_input_proj, model.sub_encoder1,
                            model.ctx_pos_embed)

    def cross(main, main_mask, side, side_mask, att, norm):
      mask = torch.einsum("bm,bn->bmn", main_mask, side_mask)
      return norm(att(main, side, side, mask) + main)

    v_cross = cross(v1, vm, s1, sm, model.video_cross_att, model.video_cross_layernorm)
    s_cross = cross(s1, sm, v1, vm, model.sub_cross_att, model.sub_cross_layernorm)
    feat1, feat2 = {}, {}
    feat1["video"], feat2["video"], feat1["sub"], feat2["sub"] = model.encode_context(
        vf, vm, sf, sm)
    vr, st, ed = model.get_pred_from_raw_query(qf, qm, feat1["video"], feat2["video"], vm,
                                               feat1["sub"], feat2["sub"], sm)
    _, _, sim, _, _ = model.get_merged_st_ed_prob(video_q, feat2["video"], sub_q, feat2["sub"],
                                                  vm, return_similaity=True)
  loss, parts = official.xml_official_loss(model, dict(
      query_feat=qf, query_mask=qm, video_feat=vf, video_mask=vm, sub_feat=sf, sub_mask=sm,
      tef_feat=None, tef_mask=None, st_ed_indices=st_ed))
  theirs = {
      "query tokens H_q": enc_q, "modular query q_video": video_q, "modular query q_sub": sub_q,
      "H_0 video": feat1["video"], "H_0 sub": feat1["sub"],
      "cross-encoder out video": v_cross, "cross-encoder out sub": s_cross,
      "H_1 video": feat2["video"], "H_1 sub": feat2["sub"], "S (eq. 2)": sim,
      "VR scores (eq. 4)": vr, "start logits": st, "end logits": ed,
      "loss L_vr": parts["loss_neg_ctx"] + parts["loss_neg_q"],
      "loss L_svmr": parts["loss_st_ed"] / 0.01, "loss total": float(loss)}
  theirs = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float32)
            for k, v in theirs.items()}

  # ------------------------------------------------------------ avtext
  j = lambda t: jnp.asarray(t.numpy())  # noqa: E731
  query, query_mask = j(qf), j(qm).astype(jnp.int32)
  ctx, ctx_mask = {"video": j(vf), "sub": j(sf)}, j(vm).astype(jnp.int32)

  def pieces(mdl):
    det = True
    x = mdl.query_pos(mdl.query_proj(query, deterministic=det), deterministic=det)
    hq = mdl.query_encoder(x, query_mask, deterministic=det)
    q = mdl.encode_query(query, query_mask)
    h0, h1 = mdl.encode_context(ctx, ctx_mask)
    crossed = {m: mdl.cross[m](h0[:, i], ctx_mask, context=h0[:, 1 - i],
                               context_mask=ctx_mask, deterministic=det)
               for i, m in enumerate(mdl.streams)}
    qs = jnp.stack([mdl.span_query[m](q[:, i]) for i, m in enumerate(mdl.streams)], axis=1)
    sim_ = jnp.mean(jnp.einsum("bmd,bmld->bml", qs, h1), axis=1)
    return hq, q, h0, h1, crossed, sim_

  hq, q, h0, h1, crossed, sim_ours = ours.apply(variables, method=pieces)
  out = ours.apply(variables, query, query_mask, ctx, ctx_mask)
  batch = {"query": query, "query_mask": query_mask, **ctx, "ctx_mask": ctx_mask,
           "start": jnp.asarray(st_ed[:, 0].numpy(), jnp.int32),
           "end": jnp.asarray(st_ed[:, 1].numpy(), jnp.int32),
           "epoch": jnp.zeros(len(items), jnp.int32)}
  our_loss, aux = official.xml_avtext_loss(loaded, batch, seed)
  mine = {
      "query tokens H_q": hq, "modular query q_video": q[:, 0], "modular query q_sub": q[:, 1],
      "H_0 video": h0[:, 0], "H_0 sub": h0[:, 1],
      "cross-encoder out video": crossed["video"], "cross-encoder out sub": crossed["sub"],
      "H_1 video": h1[:, 0], "H_1 sub": h1[:, 1], "S (eq. 2)": sim_ours,
      "VR scores (eq. 4)": out["vr_scores"], "start logits": out["start"],
      "end logits": out["end"], "loss L_vr": aux["vr_loss"], "loss L_svmr": aux["span_loss"],
      "loss total": our_loss}
  table = []
  real = np.arange(max(CLIPS))[None] < np.asarray(CLIPS)[:, None]  # [B, L]: real clips
  for name, want in theirs.items():
    got = np.asarray(mine[name], np.float32)
    if not name.startswith(("cross-encoder out", "H_1")):
      table.append((name, official.max_abs_diff(got, want), str(tuple(want.shape))))
      continue
    # The official cross mask adds -10000 to every logit of a padded clip's row, where
    # float32's spacing is 2^-10: those rows' logits carry that rounding, so their outputs
    # (read only by ConvSE at the last real clips, within 1e-4 above) agree to
    # spacing(1e4) * max |output|, not 1e-4, under any other order of the same arithmetic.
    table.append((f"{name} (real clips)",
                  official.max_abs_diff(got[real], want[real]), f"{int(real.sum())} rows"))
    table.append((f"{name} (padded clips, logits - 10000)",
                  official.max_abs_diff(got[~real], want[~real]),
                  f"{int((~real).sum())} rows",
                  float(np.spacing(np.float32(1e4)) * np.abs(want).max())))

  # What our option changes: masked_convse on the same weights and batch.
  masked = ours.clone(masked_convse=True).apply(variables, query, query_mask, ctx, ctx_mask)
  diff = np.abs(np.asarray(masked["start"]) - theirs["start logits"])
  n = [int(c) for c in CLIPS]
  moved = sorted({f"{b}:{l}" for b, l in zip(*np.nonzero(diff > 1e-4))})
  extra = [
      "",
      f"Batch: {len(items)} items, clips {list(CLIPS)} padded to {max(CLIPS)}, query tokens "
      f"{list(TOKENS)} padded to {max(TOKENS)}; hidden {HIDDEN}, {HEADS} heads, ConvSE k "
      f"{KERNEL}; seed {seed}. Loss: official {float(loss):.6f}, avtext "
      f"{float(our_loss):.6f}.",
      f"Option masked_convse (ours) on the same weights: start logits differ from the "
      f"official by up to {diff.max():.3g} at (item:clip) {moved}: the last "
      f"{KERNEL // 2} real clips of the items shorter than {max(n)} clips.",
  ]
  return table, extra


def test_xml_equals_the_official_code_on_the_same_weights():
  official.parity_test("TVRetrieval", "xml", run)

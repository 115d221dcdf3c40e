r"""MMT (TVC) parity: the official TVCaption code against avtext, same weights.

    make test-parity    # the bench venv; checkouts under $AVTEXT_OFFICIAL (common/official.py)

Marked `needs_torch`: the default `make test` deselects it; it skips, saying why, where
torch or the checkout of jayleicn/TVCaption is missing. The official model
(baselines/multimodal_transformer/transformer/model.py, MMT) is built small (hidden 32,
4 heads, 2 + 2 layers, a 40-word vocabulary, 20-d clip features; max_v_len 8,
max_sub_len 12, max_cap_len 10) with random weights: init_bert_weights, then every
LayerNorm weight 1 + N(0, 0.1) and every bias N(0, 0.1) and the Linear / embedding
weights N(0, 0.1) so a swapped or transposed tensor shows; the [EOS] bias is then raised
past its gap to the best word at ~4 % of the batch's positions, so greedy captions end
at different lengths. It is saved as the official
train.py saves it (torch.save of {"model": state_dict, "model_cfg": EasyDict, "opt":
argparse.Namespace, "epoch"}) beside a word2idx.json, imported with
`avtext.import_checkpoint.import_checkpoint("mmt", ...)` into the default paper
config (computed in float32, the paper config's bfloat16 aside) and loaded with
`avtext.runs.load_run`.

The batch: 4 moments padded as the official TVCaptionDataset pads them and
`step_collate` stacks them: [CLS] [VID] x n [SEP] [PAD].. | [BOS] subtitle [EOS] [PAD]..
with n = 6, 2, 4, 1 clips and 10, 3, 0 (an empty subtitle: [BOS] [EOS]) and 6 words;
captions of 8, 3, 5 and 1 words (+ [BOS] / [EOS], padded to max_cap_len, labels shifted
with -1 on the padding). Compared (max |diff|, eval mode, float32): the word_fc /
video_embeddings streams, the embedding output, every encoder layer, the caption
embedding, every decoder layer (the official decoder masks padded caption keys: avtext
gets the caption mask, `MMT.decode(caption_mask=...)`), the prediction head's transform
and the logits, all at every position padded ones included; the training loss
(official: model(...)[0], LabelSmoothingLoss summed over the words; avtext: the task's
`caption_loss`, config.loss.name "kl_sum") and its per-word value (train.py's logged
loss); and greedy captions: the official Translator's greedy loop
(translate_batch_single_sentence_untied_greedy, [UNK] banned, max_cap_len steps) against
the avtext task's `captions` predict function, token ids up to the first [EOS].

Shims: the checkout goes first on sys.path, and its
baselines/multimodal_transformer/transformer folder second, since beam_search.py (imported
by translator.py) imports its sibling as the top-level module `decode_strategy`; nothing
is stubbed (the bench venv has torch, easydict, nltk, h5py, tqdm). The table is printed
(`pytest -s`); the test fails if a row is outside its tolerance.
"""
import argparse
import pathlib
import tempfile

import numpy as np
import pytest

from benchmarks import common
from benchmarks.common import official

pytestmark = pytest.mark.needs_torch
max_abs_diff = official.max_abs_diff

V_LEN, SUB_LEN, CAP_LEN = 8, 12, 10
WORDS = [f"w{i:02d}" for i in range(33)]  # + 7 special tokens = 40


def _official_modules(official_dir: pathlib.Path):
  # transformer/beam_search.py (imported by translator.py) does `from decode_strategy import`:
  # the official scripts run with that folder importable.
  common.import_checkout(official_dir,
                         official_dir / "baselines/multimodal_transformer/transformer",
                         packages=("baselines", "utils", "decode_strategy"))
  # pylint: disable=g-import-not-at-top
  from baselines.multimodal_transformer.transformer import model as model_lib
  from baselines.multimodal_transformer.transformer import tvc_dataset
  from baselines.multimodal_transformer import translator
  return model_lib, tvc_dataset, translator


def _official_model(model_lib, torch, seed: int):
  from easydict import EasyDict  # pylint: disable=g-import-not-at-top
  cfg = EasyDict(
      hidden_size=32, intermediate_size=32, vocab_size=7 + len(WORDS), word_vec_size=24,
      video_feature_size=20, max_position_embeddings=max(V_LEN + SUB_LEN, CAP_LEN),
      type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=0.1, num_hidden_layers=2,
      num_attention_heads=4, attention_probs_dropout_prob=0.1, initializer_range=0.02,
      label_smoothing=0.1, share_wd_cls_weight=False)
  torch.manual_seed(seed)
  model = model_lib.MMT(cfg)
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen) * 0.1
      if "LayerNorm" in name or "norm" in name.split(".")[-2] or \
          name.split(".")[-2] in ("0", "4"):  # LayerNorms (word_fc / video_embeddings .0 .4)
        p.copy_(1.0 + noise if name.endswith("weight") else noise)
      else:
        p.copy_(noise)
  return model.eval(), cfg


def _examples(tvc_dataset, rng):
  """Official-format examples (TVCaptionDataset.convert_example_to_features' dict)."""
  ds = tvc_dataset.TVCaptionDataset
  out = []
  for n_clips, n_sub, n_cap in ((6, 10, 8), (2, 3, 3), (4, 0, 5), (1, 6, 1)):
    video_ids = [ds.CLS] + [ds.VID] * n_clips + [ds.SEP]
    video_mask = [1] * len(video_ids) + [0] * (V_LEN - len(video_ids))
    video_ids += [ds.PAD] * (V_LEN - len(video_ids))
    sub = [ds.BOS] + list(rng.integers(7, 7 + len(WORDS), n_sub)) + [ds.EOS]
    sub_mask = [1] * len(sub) + [0] * (SUB_LEN - len(sub))
    sub += [ds.PAD] * (SUB_LEN - len(sub))
    feat = np.zeros((V_LEN + SUB_LEN, 20), np.float32)
    feat[1:n_clips + 1] = rng.normal(size=(n_clips, 20))
    cap = [ds.BOS] + list(rng.integers(7, 7 + len(WORDS), n_cap)) + [ds.EOS]
    cap_mask = [1] * len(cap) + [0] * (CAP_LEN - len(cap))
    cap += [ds.PAD] * (CAP_LEN - len(cap))
    labels = [ds.IGNORE if m == 0 else t for t, m in zip(cap, cap_mask)][1:] + [ds.IGNORE]
    out.append(dict(
        caption_input_ids=np.array(cap, np.int64), caption_mask=np.array(cap_mask, np.float32),
        caption_labels=np.array(labels, np.int64),
        ctx_input_ids=np.array(video_ids + sub, np.int64),
        ctx_input_mask=np.array(video_mask + sub_mask, np.float32),
        ctx_token_type_ids=np.array([0] * V_LEN + [1] * SUB_LEN, np.int64),
        video_feature=feat))
  return out


def run(official_dir: pathlib.Path, seed: int = 0):
  """(rows, extra lines) of the parity table."""
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from avtext import runs  # pylint: disable=g-import-not-at-top
  from avtext.text import vocab  # pylint: disable=g-import-not-at-top
  from avtext import import_checkpoint as import_tool  # pylint: disable=g-import-not-at-top


  torch.set_grad_enabled(False)
  model_lib, tvc_dataset, translator = _official_modules(official_dir)
  model, cfg = _official_model(model_lib, torch, seed)
  rng = np.random.default_rng(seed)
  batch = tvc_dataset.step_collate(_examples(tvc_dataset, rng))  # torch tensors [B, ...]
  # A random model seldom ends a caption: raise the [EOS] bias past the gap to the best word
  # at ~4 % of this batch's positions, so greedy captions stop at different lengths.
  eos = tvc_dataset.TVCaptionDataset.EOS
  scores = model(**batch)[1]
  gap = torch.quantile((scores.max(-1).values - scores[..., eos]).flatten(), 0.04)
  model.decoder_classifier.bias[eos] += gap + 0.0123  # off any position's exact gap

  tmp = pathlib.Path(tempfile.mkdtemp(prefix="parity_mmt_"))
  opt = argparse.Namespace(max_v_len=V_LEN, max_sub_len=SUB_LEN, max_cap_len=CAP_LEN,
                           ctx_mode="video_sub", no_norm_vfeat=True, vid_feat_size=20,
                           word2idx_path="./cache/word2idx.json", label_smoothing=0.1)
  ckpt = tmp / "model.chkpt"
  torch.save({"model": model.state_dict(), "model_cfg": model.config, "opt": opt, "epoch": 0},
             ckpt)
  vocab.WordVocab.build([" ".join(WORDS)], min_count=0).save(tmp / "word2idx.json")
  config = common.load_config("configs/mmt_tvc.py")
  config.model.dtype = "float32"
  run_dir = import_tool.import_checkpoint("mmt", str(ckpt), str(tmp / "run"), config)
  ours = runs.load_run(run_dir)
  net, variables = ours.model, {"params": ours.params}
  task = ours.task()

  # ---- official intermediates (forward hooks) and loss
  seen = {}

  def hook(name):
    def fn(_, __, output):
      seen.setdefault(name, []).append(output[-1] if isinstance(output, list) else output)
    return fn

  emb = model.embeddings
  hooks = [(emb.word_fc, "word_fc"), (emb.video_embeddings, "video_fc"), (emb, "embeddings"),
           (model.decoder_classifier.transform, "head_transform"),
           (model.decoder_classifier, "logits")]
  hooks += [(layer, f"encoder_{i}") for i, layer in enumerate(model.encoder.layer)]
  hooks += [(layer, f"decoder_{i}") for i, layer in enumerate(model.decoder.layer)]
  handles = [m.register_forward_hook(hook(n)) for m, n in hooks]
  loss, scores = model(**batch)
  for h in handles:
    h.remove()
  caption_emb = emb.get_caption_word_embedding(batch["caption_input_ids"])

  # ---- ours: the same forward, intermediates captured
  np_batch = {k: v.numpy() for k, v in batch.items()}
  ctx = (np_batch["ctx_input_ids"].astype(np.int32), np_batch["video_feature"],
         np_batch["ctx_input_mask"].astype(np.int32),
         np_batch["ctx_token_type_ids"].astype(np.int32))
  caption = np_batch["caption_input_ids"].astype(np.int32)
  cap_mask = np_batch["caption_mask"].astype(np.int32)
  logits, state = net.apply(variables, *ctx, caption, caption_mask=cap_mask,
                            capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]
  memory = net.apply(variables, *ctx, method=net.encode)
  pe = net.apply(variables, 0, CAP_LEN, method=net._positions)  # pylint: disable=protected-access
  word = lambda ids: net.apply(variables, ids, method=lambda m, i: m.word_fc(  # noqa: E731
      m.word_embeddings(i), deterministic=True))

  rows = []

  def row(name, a, b):
    a, b = np.asarray(a), np.asarray(b.detach().numpy() if hasattr(b, "detach") else b)
    rows.append((name, max_abs_diff(a, b), "x".join(map(str, a.shape))))

  row("context word_fc(E[ids])", inter["word_fc"]["__call__"][0], seen["word_fc"][0])
  row("video_fc (video_embeddings)", inter["video_fc"]["__call__"][0], seen["video_fc"][0])
  row("context embedding (after LayerNorm)", inter["embedding_norm"]["__call__"][0],
      seen["embeddings"][0])
  for i in range(len(model.encoder.layer)):
    row(f"encoder layer {i}", inter[f"encoder_{i}"]["__call__"][0], seen[f"encoder_{i}"][0])
  row("encoder output (MMT.encode)", memory, seen[f"encoder_{len(model.encoder.layer) - 1}"][0])
  row("caption embedding word_fc(E[ids]) + PE", word(caption) + pe[None], caption_emb)
  for i in range(len(model.decoder.layer)):
    row(f"decoder layer {i} (caption keys masked)", inter[f"decoder_{i}"]["__call__"][0],
        seen[f"decoder_{i}"][0])
  row("head transform (Dense, GELU, LayerNorm)", inter["head_norm"]["__call__"][0],
      seen["head_transform"][0])
  row("logits", logits, scores)

  labels = np_batch["caption_labels"]
  target = {"target_ids": np.where(labels < 0, 0, labels).astype(np.int32),
            "target_mask": (labels >= 0).astype(np.int32)}
  our_loss, metrics, _ = task.caption_loss(logits, target)
  row("training loss (LabelSmoothingLoss, sum over words)", our_loss, loss)
  n_words = int(target["target_mask"].sum())
  row("logged loss per word (train.py total_loss / n_word)", metrics["loss_per_word"],
      loss / n_words)
  # Without the caption mask (as training runs): the loss is the same.
  free = net.apply(variables, *ctx, caption)
  row("training loss, decoder without caption mask", task.caption_loss(free, target)[0], loss)

  # ---- greedy captions
  theirs = translator.Translator.translate_batch_single_sentence_untied_greedy(
      batch, model, max_cap_len=CAP_LEN).numpy()[:, 1:]
  pred_ctx = dict(zip(("ctx_ids", "video", "ctx_mask", "token_type_ids"), ctx))
  out = jax.device_get(task.predict_fns()["captions"](variables, pred_ctx))
  mismatched, lines = 0, []
  for b in range(len(theirs)):
    ref = [int(t) for t in theirs[b]]
    ref = ref[:ref.index(eos) + 1] if eos in ref else ref
    got = [int(t) for t in np.asarray(out["tokens"][b][:int(out["lengths"][b])])]
    mismatched += int(got != ref)
    lines.append(f"  greedy {b}: official {ref} avtext {got}")
  # The argmax margin along the official greedy paths (our logits, [UNK] banned): how far
  # each chosen word was from a tie.
  path = np.concatenate([np.full((len(theirs), 1), tvc_dataset.TVCaptionDataset.BOS),
                         theirs[:, :-1]], 1).astype(np.int32)
  steps = np.array(net.apply(variables, *ctx, path))
  steps[..., tvc_dataset.TVCaptionDataset.UNK] = -np.inf
  top2 = np.sort(steps, -1)[..., -2:]
  margin = float(np.min(top2[..., 1] - top2[..., 0]))
  rows.append(("greedy captions: rows not token-identical", float(mismatched),
               f"{len(theirs)} captions"))
  extra = ["", f"Greedy captions (official Translator vs avtext predict fn, {len(theirs)} "
           f"moments; smallest top-2 logit margin along the greedy paths {margin:.2e}):",
           *lines, f"Official loss {float(loss):.6f} over {n_words} words; checkpoint {ckpt}"]
  return rows, extra


def test_mmt_equals_the_official_code_on_the_same_weights():
  official.parity_test("TVCaption", "mmt", run)

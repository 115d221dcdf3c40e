"""TVC's MMT: data rules, vocabulary, model numerics, decoding, and a tiny end-to-end run."""
import json
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from avtext import errors
from avtext import experiment
from avtext.data import builders
from avtext.data import coot_files
from avtext.data.builders import tvc
from avtext.inference import generate
from avtext.metrics import captioning as caption_metrics
from avtext.models import mmt
from avtext.tasks import mmt as mmt_task
from avtext.tasks import task_registry
from avtext.text import vocab as vocab_lib
from avtext.train import optimizers
from avworld import longvideo
from avworld import truth
from avworld import tvr_layout
from avworld import world

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import mmt_tvc  # pylint: disable=g-import-not-at-top,wrong-import-position


# ---------------------------------------------------------------- data rules (TVCaption)


def test_moment_clip_indices_and_rows_follow_the_official_rules():
  assert mmt_task.moment_clips([0.0, 2.29], 10) == (0, 2)  # clips 0, 1, 2 (ed inclusive)
  assert mmt_task.moment_clips([16.48, 33.87], 60) == (10, 23)
  np.testing.assert_array_equal(mmt_task.video_rows(2, 5, 30, 18), [2, 3, 4, 5])
  # 27 clips > 18: linspace(3, 29, 18) floored (ed clamped from 40 to the last clip, 29).
  np.testing.assert_array_equal(mmt_task.video_rows(3, 40, 30, 18),
                                [3, 4, 6, 7, 9, 10, 12, 13, 15, 16, 18, 19, 21, 22, 24, 25, 27,
                                 29])
  # A moment starting past the features' end: ed = 7, st -> ed - 1.
  np.testing.assert_array_equal(mmt_task.video_rows(10, 12, 8, 18), [6, 7])


def test_moment_subtitle_takes_lines_touching_its_clips():
  subs = [(0.5, 1.2, "a"),   # clips {0}
          (1.4, 3.1, "b"),   # floor(0.93) = 0 .. ceil(2.07) = 3 exclusive: {0, 1, 2}
          (4.5, 6.0, "c"),   # {3}
          (6.0, 6.0, "d"),   # floor 4, ceil 4: no clip at all (official range is empty)
          (7.4, 9.0, "e")]   # {4, 5}
  assert mmt_task.moment_subtitle(subs, 1, 3) == "b c"
  assert mmt_task.moment_subtitle(subs, 0, 0) == "a b"
  assert mmt_task.moment_subtitle(subs, 4, 9) == "e"


def test_word_tokenize_and_vocab():
  assert vocab_lib.word_tokenize("Alice : I can't find my Keys. Has anyone seen them?") == [
      "alice", ":", "i", "ca", "n't", "find", "my", "keys", ".", "has", "anyone", "seen", "them",
      "?"]
  texts = ["the dog runs ."] * 6 + ["a cat"] * 5 + ["dog"]
  vocab = vocab_lib.WordVocab.build(texts, min_count=5)
  # Seen > 5 times: dog (7), the, runs, "." (6); cat / a (5) are not kept. By count, then name.
  assert list(vocab.word2idx)[7:] == ["dog", ".", "runs", "the"]
  ids, mask = vocab.encode("The cat runs", 6)
  np.testing.assert_array_equal(ids, [4, 10, 6, 9, 5, 0])  # BOS the UNK runs EOS PAD
  np.testing.assert_array_equal(mask, [1, 1, 1, 1, 1, 0])
  cap = vocab.caption("the dog runs . the dog", 5)  # cut to 3 words
  np.testing.assert_array_equal(cap["input_ids"], [4, 10, 7, 9])
  np.testing.assert_array_equal(cap["target_ids"], [10, 7, 9, 5])
  np.testing.assert_array_equal(cap["target_mask"], [1, 1, 1, 1])
  assert vocab.decode([10, 7, 5, 9, 9]) == "the dog"
  assert vocab.decode([4, 10, 0, 6]) == "the [UNK]"
  with pytest.raises(ValueError, match=r"\[UNK\] must have id 6"):
    vocab_lib.WordVocab({**vocab.word2idx, "[UNK]": 11, "x": 6})


# ---------------------------------------------------------------- model


def _tiny_model(vocab_size=23, video_dim=6, **kw):
  return mmt.MMT(vocab_size=vocab_size, video_dim=video_dim, hidden_size=16, num_layers=2,
                 num_heads=2, intermediate_size=16, word_dim=8, max_positions=24, **kw)


def _context(rng, batch=3, v_len=6, s_len=5, video_dim=6, vocab=23):
  ids = rng.integers(7, vocab, size=(batch, v_len + s_len)).astype(np.int32)
  mask = np.ones((batch, v_len + s_len), np.int32)
  mask[0, 4:v_len] = 0
  mask[1, v_len + 3:] = 0
  video = rng.normal(size=(batch, v_len + s_len, video_dim)).astype(np.float32)
  types = np.concatenate([np.zeros(v_len, np.int32), np.ones(s_len, np.int32)])
  return ids, video, mask, np.broadcast_to(types, ids.shape).copy()


def test_sinusoidal_positions_hand_computed():
  pe = mmt.sinusoidal_positions(5, 6)
  np.testing.assert_allclose(pe[0], [0, 1, 0, 1, 0, 1], atol=1e-7)
  f1, f2 = 10000 ** (-2 / 6), 10000 ** (-4 / 6)
  np.testing.assert_allclose(pe[3], [np.sin(3), np.cos(3), np.sin(3 * f1), np.cos(3 * f1),
                                     np.sin(3 * f2), np.cos(3 * f2)], rtol=1e-6)


def test_embedding_stage_is_the_sum_of_its_streams():
  """encode with no layers = LN(word_fc(E[ids]) + video_fc(v) + T[type] + PE), in numpy."""
  model = mmt.MMT(vocab_size=23, video_dim=6, hidden_size=16, num_layers=0, num_heads=2,
                  intermediate_size=16, word_dim=8, max_positions=24)
  ids, video, mask, types = _context(np.random.default_rng(0))
  params = model.init(jax.random.PRNGKey(0), ids, video, mask, types, ids[:, :4])["params"]
  params = jax.tree.map(lambda x: x + 0.1 * np.random.default_rng(1).normal(size=x.shape),
                        params)  # non-trivial LayerNorm scales and biases
  got = model.apply({"params": params}, ids, video, mask, types, method=model.encode)

  def ln(x, p, eps=1e-12):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])

  def proj(x, p):
    h = ln(x, p["norm_in"]) @ np.asarray(p["dense"]["kernel"]) + np.asarray(p["dense"]["bias"])
    return ln(np.maximum(h, 0), p["norm_out"])

  p = jax.tree.map(np.asarray, params)
  want = (proj(p["word_embeddings"]["embedding"][ids], p["word_fc"]) + proj(video, p["video_fc"])
          + p["token_type_embeddings"]["embedding"][types]
          + mmt.sinusoidal_positions(24, 16)[None, :ids.shape[1]])
  np.testing.assert_allclose(got, ln(want, p["embedding_norm"]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("decoder_layer", ["official", "standard"])
def test_cached_decoding_equals_teacher_forcing_and_ignores_masked_context(decoder_layer):
  model = _tiny_model(decoder_layer=decoder_layer)
  rng = np.random.default_rng(0)
  ids, video, mask, types = _context(rng)
  caption = rng.integers(4, 23, size=(3, 7)).astype(np.int32)
  variables = model.init(jax.random.PRNGKey(1), ids, video, mask, types, caption)
  full = model.apply(variables, ids, video, mask, types, caption)
  memory = model.apply(variables, ids, video, mask, types, method=model.encode)
  cache = model.apply(variables, memory, mask, 7, method=model.init_cache,
                      mutable=["cache"])[1]["cache"]
  cache = jax.tree.map(jnp.zeros_like, cache)
  for t in range(7):
    logits, mutated = model.apply({**variables, "cache": cache}, caption[:, t], t, memory, mask,
                                  7, method=model.decode_step, mutable=["cache"])
    cache = mutated["cache"]
    np.testing.assert_allclose(logits, full[:, t], rtol=1e-5, atol=1e-5)
  # Masked context positions (row 0's padded video, row 1's padded subtitles) do not matter.
  ids2, video2 = ids.copy(), video.copy()
  ids2[0, 4:6], video2[1, 9:] = 8, 5.0
  np.testing.assert_allclose(model.apply(variables, ids2, video2, mask, types, caption), full,
                             rtol=1e-5, atol=1e-5)


def test_official_decoder_layer_is_the_default_and_standard_is_kept():
  """Official (default): no output Linear after either attention, one Linear(D, D) as the
  feed-forward part; "standard": output Linears and the GELU MLP (intermediate_size)."""
  ids, video, mask, types = _context(np.random.default_rng(0))

  def decoder_params(**kw):
    model = mmt.MMT(vocab_size=23, video_dim=6, hidden_size=16, num_layers=2, num_heads=2,
                    intermediate_size=24, word_dim=8, max_positions=24, **kw)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids, video, mask, types,
                            ids[:, :3])["params"]
    return jax.tree.map(lambda x: x.shape, params["decoder_0"])

  official = decoder_params()
  assert official == decoder_params(decoder_layer="official")
  assert "out" not in official["attention"] and "out" not in official["cross_attention"]
  assert official["mlp"] == {"kernel": (16, 16), "bias": (16,)}
  standard = decoder_params(decoder_layer="standard")
  assert standard["attention"]["out"]["kernel"] == (2, 8, 16)
  assert standard["mlp"]["dense_in"]["kernel"] == (16, 24)
  with pytest.raises(ValueError, match="decoder_layer='ours'"):
    decoder_params(decoder_layer="ours")


def test_caption_mask_changes_only_the_padded_positions():
  """The official decoder also masks padded caption keys: real positions (all before the
  pads) are unchanged, the padded ones now see only the real tokens."""
  model = _tiny_model()
  rng = np.random.default_rng(4)
  ids, video, mask, types = _context(rng)
  caption = rng.integers(4, 23, size=(3, 7)).astype(np.int32)
  cap_mask = np.ones_like(caption)
  cap_mask[0, 4:] = 0
  cap_mask[2, 2:] = 0
  variables = model.init(jax.random.PRNGKey(1), ids, video, mask, types, caption)
  free = np.asarray(model.apply(variables, ids, video, mask, types, caption))
  masked = np.asarray(model.apply(variables, ids, video, mask, types, caption,
                                  caption_mask=cap_mask))
  real = cap_mask.astype(bool)
  np.testing.assert_allclose(masked[real], free[real], rtol=1e-5, atol=1e-5)
  assert np.abs(masked[~real] - free[~real]).max() > 1e-3
  # A padded position no longer depends on the other padded tokens.
  caption2 = caption.copy()
  caption2[0, 4:6] = 5
  np.testing.assert_allclose(masked[0, 6], np.asarray(model.apply(
      variables, ids, video, mask, types, caption2, caption_mask=cap_mask))[0, 6],
                             rtol=1e-5, atol=1e-5)


def test_config_defaults_are_official_and_variants_name_ours():
  config = mmt_tvc.get_config()
  assert (config.model.decoder_layer, config.loss.name) == ("official", "kl_sum")
  for variant in ("demo", "tiny", "video,tiny"):
    tiny = mmt_tvc.get_config(variant)
    assert (tiny.model.decoder_layer, tiny.loss.name) == ("official", "kl_sum"), variant
    assert tiny.model.intermediate_size == tiny.model.hidden_size  # the official layer's need
  ours = mmt_tvc.get_config("tiny,standard_decoder,mean_nll")
  assert (ours.model.decoder_layer, ours.loss.name) == ("standard", "nll")
  with pytest.raises(ValueError, match="unknown variant"):
    mmt_tvc.get_config("ours")


def test_vocab_size_alone_sizes_the_model_and_the_task_asks_for_the_vocab():
  """config.model.vocab_size without config.model.vocab builds the model (AOT sizing), and
  the task, which reads and writes captions through the vocabulary, says to set it."""
  config = mmt_tvc.get_config()
  config.model.vocab_size = 100
  assert config.model.vocab is None
  assert task_registry.build_task.__module__  # the registry itself imports
  model = mmt.mmt_from_config(config.model)
  assert model.vocab_size == 100
  with pytest.raises(errors.BadInput, match=r"config\.model\.vocab is not set.*caption_vocab"):
    task_registry.build_task(config)
  config.model.vocab_size = None
  with pytest.raises(errors.BadInput, match=r"config\.model\.vocab is not set"):
    mmt.mmt_from_config(config.model)


@pytest.mark.slow  # ~18 s; cached decoding = teacher forcing stays in the default run
def test_greedy_generation_equals_a_full_recompute_loop_with_unk_banned():
  model = _tiny_model()
  rng = np.random.default_rng(3)
  ids, video, mask, types = _context(rng)
  variables = model.init(jax.random.PRNGKey(2), ids, video, mask, types, ids[:, :3])
  ctx = dict(ctx_ids=ids, video=video, ctx_mask=mask, token_type_ids=types)
  start, step = mmt.captioner_decoding_fns(model, variables, ctx, 9)
  out = jax.jit(lambda: generate.greedy(start, step, max_new_tokens=9, eos_id=mmt.EOS))()
  # Reference: the official translator's loop (whole prefix re-decoded every step).
  seq = np.full((3, 1), mmt.BOS, np.int32)
  for _ in range(9):
    logits = np.array(model.apply(variables, ids, video, mask, types, seq))[:, -1]
    logits[:, mmt.UNK] = -np.inf
    seq = np.concatenate([seq, logits.argmax(-1)[:, None].astype(np.int32)], axis=1)
  for b in range(3):
    row = list(seq[b, 1:])
    n = row.index(mmt.EOS) + 1 if mmt.EOS in row else 9
    np.testing.assert_array_equal(np.asarray(out["tokens"])[b, :n], row[:n])
    assert int(out["lengths"][b]) == n
  assert mmt.UNK not in np.asarray(out["tokens"])


def test_linear_schedule_and_weight_decay_exclusion():
  opt = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1.0, weight_decay=0.5,
                                       weight_decay_exclude=(r"bias$",), schedule="linear",
                                       warmup_steps=2))
  sched = optimizers.learning_rate_schedule(opt, total_steps=10, steps_per_epoch=5)
  np.testing.assert_allclose([sched(s) for s in (0, 1, 2, 6, 10)], [0, 0.5, 1.0, 0.5, 0.0])
  tx, _ = optimizers.make_optimizer(opt, total_steps=10, steps_per_epoch=5)
  params = {"dense": {"kernel": jnp.ones(3), "bias": jnp.ones(3)}}
  state = tx.init(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  for _ in range(3):
    updates, state = tx.update(zero, state, params)
  # Step 2 (lr 1): zero gradients, so only the decay moves the kernel: -lr * wd * p.
  np.testing.assert_allclose(updates["dense"]["kernel"], -0.5 * np.ones(3))
  np.testing.assert_allclose(updates["dense"]["bias"], np.zeros(3))


# ---------------------------------------------------------------- dataset + end to end


def write_synthetic_tvc(path: pathlib.Path, *, num=(12, 4, 4), dim=8, seed=0) -> pathlib.Path:
  """The synthetic TVC layout with random clip features (no tower)."""
  spec = world.WorldSpec(height=32, width=32)
  clip_ids, desc_ids = iter(range(10**6)), iter(range(10**6))
  rng = np.random.default_rng(seed)
  feats, subs = {}, []
  (path / "video_feature").mkdir(parents=True, exist_ok=True)
  for (name, split), n in zip(tvr_layout.SPLITS, num):
    src = longvideo.LongVideoSource(split, num_examples=n, spec=spec)
    rows, _, s = tvr_layout.annotations(src, range(n), clip_ids, desc_ids)
    (tvc.annotation_path(path, name)).write_text("".join(json.dumps(r) + "\n" for r in rows))
    subs += s
    feats.update({src.video_id(i): rng.normal(size=(src.num_clips(i), dim)) for i in range(n)})
  (path / tvc.DEFAULT_SUBTITLES).write_text("".join(json.dumps(r) + "\n" for r in subs))
  coot_files.write_video_features_h5(path / "video_feature", tvr_layout.VIDEO_FEATURES,
                                         feats)
  truth.write_world_file(path)  # as tvr_layout.write does
  return path


@pytest.fixture(scope="module")
def tvc_dir(tmp_path_factory):
  return write_synthetic_tvc(tmp_path_factory.mktemp("tvc"))


def _dataset_config(path, **kw):
  return ml_collections.ConfigDict({**dict(name="tvc", path=str(path), video_dim=8,
                                          video_features=tvr_layout.VIDEO_FEATURES), **kw})


def test_tvc_source_reads_the_official_layout(tvc_dir, tmp_path):
  src = builders.get_source(_dataset_config(tvc_dir), "val")
  lines = [json.loads(l) for l in (tvc_dir / "tvc_val_release.jsonl").read_text().splitlines()]
  assert len(src) == len(lines) and src.has_descs
  item = src[2]
  assert item["id"] == lines[2]["clip_id"] and item["ts"] == lines[2]["ts"]
  assert item["descs"] == [d["desc"] for d in lines[2]["descs"]] and len(item["descs"]) == 4
  assert item["video"].shape[1] == 8 and json.loads(item["attributes"]) == lines[2]["attributes"]
  subs = [json.loads(l) for l in (tvc_dir / tvc.DEFAULT_SUBTITLES).read_text().splitlines()]
  want = next(s["sub"] for s in subs if s["vid_name"] == item["vid_name"])
  assert item["subtitles"] == [(s["start"], s["end"], s["text"]) for s in want]
  # The world that wrote the directory is its ground truth; the real TVC has none.
  assert src.ground_truth is truth.WORLD
  real = tmp_path / "real"
  shutil.copytree(tvc_dir, real, ignore=shutil.ignore_patterns("world.json"))
  assert builders.get_source(_dataset_config(real), "val").ground_truth is None


def test_tvc_source_errors_name_the_file_line_and_field(tvc_dir, tmp_path):
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "video_feature").symlink_to(tvc_dir / "video_feature")
  lines = (tvc_dir / "tvc_val_release.jsonl").read_text().splitlines()
  row = json.loads(lines[1])
  row["ts"] = [3.0]
  (bad / "tvc_val_release.jsonl").write_text("\n".join([lines[0], json.dumps(row)]))
  (bad / tvc.DEFAULT_SUBTITLES).write_text((tvc_dir / tvc.DEFAULT_SUBTITLES).read_text())
  with pytest.raises(ValueError, match=r"tvc_val_release.jsonl, line 2: ts must be \[start, end\]"):
    builders.get_source(_dataset_config(bad), "val")
  (bad / "tvc_val_release.jsonl").write_text(lines[0])
  (bad / tvc.DEFAULT_SUBTITLES).write_text("")
  with pytest.raises(ValueError, match=r"no subtitles for 1 videos"):
    builders.get_source(_dataset_config(bad), "val")
  (bad / tvc.DEFAULT_SUBTITLES).write_text((tvc_dir / tvc.DEFAULT_SUBTITLES).read_text())
  with pytest.raises(ValueError, match=r"config.dataset.video_dim=9: the features in .* "
                     r"are 8-d; set --config.dataset.video_dim=8 --config.model.video_dim=8"):
    builders.get_source(_dataset_config(bad, video_dim=9), "val")
  with pytest.raises(FileNotFoundError, match=r"video features .*other.h5 not found"):
    builders.get_source(_dataset_config(bad, video_features="other"), "val")


def _tiny_config(tvc_dir, vocab_path) -> ml_collections.ConfigDict:
  config = mmt_tvc.get_config("tiny")
  config.dataset.path = str(tvc_dir)
  config.dataset.video_dim = config.model.video_dim = 8
  config.model.vocab = str(vocab_path)
  return config


def test_context_example_layout(tvc_dir, tmp_path):
  src = builders.get_source(_dataset_config(tvc_dir), "train")
  vocab = vocab_lib.WordVocab.build(
      [d for i in range(len(src)) for d in src.describe(i)["descs"]], min_count=0)
  vocab.save(tmp_path / "w.json")
  task = task_registry.build_task(_tiny_config(tvc_dir, tmp_path / "w.json"))
  item = src[1]
  ex = task.context_example(item)
  st, ed = mmt_task.moment_clips(item["ts"], len(item["video"]))
  rows = mmt_task.video_rows(st, ed, len(item["video"]), 6)  # max_v_len 8 in :tiny
  n = len(rows)
  assert ex["ctx_ids"][:n + 2].tolist() == [1] + [3] * n + [2]
  assert ex["ctx_ids"][n + 2:8].tolist() == [0] * (6 - n) and ex["ctx_mask"][:8].sum() == n + 2
  np.testing.assert_array_equal(ex["video"][1:n + 1], item["video"][rows])
  assert not ex["video"][n + 1:].any()
  sub_ids, sub_mask = vocab.encode(mmt_task.moment_subtitle(item["subtitles"], st, ed), 12)
  np.testing.assert_array_equal(ex["ctx_ids"][8:], sub_ids)
  np.testing.assert_array_equal(ex["ctx_mask"][8:], sub_mask)
  assert ex["token_type_ids"].tolist() == [0] * 8 + [1] * 12
  assert task.num_train_examples() == 2 * len(src)  # every (moment, description) pair


@pytest.mark.slow  # default-run budget (BENCHMARKS.md, "Default test run"); `make test-slow`
def test_tiny_mmt_run_writes_a_tvc_submission_scored_like_the_official_eval(tvc_dir, tmp_path):
  config = _tiny_config(tvc_dir, tmp_path / "w.json")
  src = builders.get_source(_dataset_config(tvc_dir), "train")
  vocab_lib.WordVocab.build([d for i in range(len(src)) for d in src.describe(i)["descs"]],
                            min_count=0).save(config.model.vocab)
  workdir = tmp_path / "run"
  experiment.build(config, str(workdir)).train()
  results = json.loads((workdir / "results.json").read_text())
  sub = [json.loads(l) for l in
         (workdir / "captions" / "test_step6.jsonl").read_text().splitlines()]
  refs = [json.loads(l) for l in (tvc_dir / "tvc_test_public_release.jsonl").read_text().splitlines()]
  assert [s["clip_id"] for s in sub] == [r["clip_id"] for r in refs]
  assert all(set(s) == {"descs", "clip_id", "ts", "vid_name"} for s in sub)
  # The official evaluate.py's scoring: every description a reference, the first prediction.
  metrics = caption_metrics.caption_metrics(
      {r["clip_id"]: [d["desc"] for d in r["descs"]] for r in refs},
      {s["clip_id"]: s["descs"][0]["desc"] for s in sub})
  for key in ("BLEU-1", "BLEU-4", "CIDEr-D", "METEOR", "ROUGE-L"):
    np.testing.assert_allclose(results["6"][f"test/{key}"], metrics[key], rtol=1e-9)
  assert results["best"]["step"] in (3, 6)  # selected on val CIDEr-D
  # A split released without descriptions (TVC test_public) is captioned, not scored.
  blind = tmp_path / "blind"
  shutil.copytree(tvc_dir, blind)
  (blind / "tvc_test_public_release.jsonl").write_text("".join(
      json.dumps({k: v for k, v in r.items() if k != "descs"}) + "\n" for r in refs))
  config.evals.test.dataset = ml_collections.ConfigDict(dict(path=str(blind)))
  out = experiment.build(config, str(workdir)).evaluate()
  assert out["test/num_videos"] == len(refs) and "test/CIDEr-D" not in out
  again = (workdir / "captions" / "test_step6.jsonl").read_text().splitlines()
  assert [json.loads(l) for l in again] == sub  # the same captions, now a submission only


def test_default_config_says_what_to_prepare(tmp_path):
  config = mmt_tvc.get_config()
  assert (config.model.hidden_size, config.model.num_layers, config.data.max_v_len,
          config.data.max_sub_len, config.data.max_cap_len) == (768, 2, 20, 30, 20)
  with pytest.raises(ValueError, match=r"config.model.vocab is not set: .*a word2idx JSON "
                                       r"\(TVCaption's tvc_word2idx.json, or python -m "
                                       r"avtext.tools.caption_vocab\)"):
    task_registry.build_task(config)
  vocab_lib.WordVocab.build([]).save(tmp_path / "w.json")
  config.model.vocab = str(tmp_path / "w.json")
  with pytest.raises(ValueError, match=r"config.dataset.path is not set: the TVC directory"):
    task_registry.build_task(config).num_train_examples()

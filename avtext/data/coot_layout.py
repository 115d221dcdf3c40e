"""COOT's on-disk feature layout (simon-ging/coot-videotext): readers and writers.

A dataset directory `<path>` (e.g. `.../activitynet`, `.../youcook2`) holds:

  meta_<metadata_name>.json   (default meta_all.json)
      {key: {"data_key": str        id of the video in the feature files,
             "split": str           "train", "val_1", "val_2" (ActivityNet), "val" (YouCook2),
             "duration_sec": float,
             "segments": [{"start_sec": float, "stop_sec": float, "text": str}, ...]}}
      (other fields are ignored)
  video features, source "h5":
      <video_features>.h5         one dataset per data_key, float [T, D]
                                  (YouCook2: video_feat_100m.h5, D = 512)
  video features, source "npz_activitynet":
      features/<video_features>/v_<data_key>.npz
                                  array "frame_scores" float [T, 1, D, 1, 1]
                                  (ICEP_V3_global_pool_skip_8_direct_resize, D = 2048)
  <video_features>_num_frames.json   optional {data_key: T} (written on first read)
  text features:
      <text_features>.h5          one dataset per key, float [num_tokens, Dt]: BERT's last
                                  two layers concatenated per token (bert-base: 1536)
      <text_features>_sentence_splits.json   {key: [tokens of sentence 1, 2, ...]}, summing
                                  to num_tokens; with the official "bert_paper" text
                                  ("[CLS]" + sentences each ending in "[SEP]") the [CLS]
                                  token counts to the first sentence.

`python -m avtext.tools.precompute_text_features` writes the text files from
the meta file with our `Bert` (`encode_paragraphs`).
"""
import json
import os
import pathlib
import re
from typing import Mapping, Sequence

import numpy as np

_WHITESPACE = re.compile(r"\s+")


def meta_path(dataset_dir, metadata_name: str = "all") -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"meta_{metadata_name}.json"


def _atomic_write(path: pathlib.Path, write) -> pathlib.Path:
  tmp = path.with_name(path.name + ".tmp")
  write(tmp)
  os.replace(tmp, path)
  return path


def write_meta(dataset_dir, meta: Mapping, metadata_name: str = "all") -> pathlib.Path:
  path = meta_path(dataset_dir, metadata_name)
  path.parent.mkdir(parents=True, exist_ok=True)
  return _atomic_write(path, lambda p: p.write_text(json.dumps(meta)))


def write_video_features_h5(dataset_dir, name: str,
                            features: Mapping[str, np.ndarray]) -> pathlib.Path:
  """`<name>.h5` (one [T, D] dataset per data key) and `<name>_num_frames.json`."""
  import h5py  # pylint: disable=g-import-not-at-top
  directory = pathlib.Path(dataset_dir)
  directory.mkdir(parents=True, exist_ok=True)

  def write(tmp):
    with h5py.File(tmp, "w") as h5:
      for key, value in features.items():
        h5[key] = np.asarray(value, np.float32)

  _atomic_write(directory / f"{name}_num_frames.json",
                lambda p: p.write_text(json.dumps({k: int(len(v)) for k, v in features.items()})))
  return _atomic_write(directory / f"{name}.h5", write)


def write_text_features(dataset_dir, name: str, features: Mapping[str, np.ndarray],
                        sentence_lengths: Mapping[str, Sequence[int]]) -> pathlib.Path:
  """`<name>.h5` (one [tokens, Dt] dataset per key) and `<name>_sentence_splits.json`."""
  import h5py  # pylint: disable=g-import-not-at-top
  directory = pathlib.Path(dataset_dir)
  directory.mkdir(parents=True, exist_ok=True)
  for key, value in features.items():
    if sum(sentence_lengths[key]) != len(value):
      raise ValueError(f"text features of {key!r}: {len(value)} tokens but the sentence "
                       f"lengths sum to {sum(sentence_lengths[key])}")

  def write(tmp):
    with h5py.File(tmp, "w") as h5:
      for key, value in features.items():
        h5[key] = np.asarray(value, np.float32)

  _atomic_write(directory / f"{name}_sentence_splits.json", lambda p: p.write_text(
      json.dumps({k: [int(n) for n in v] for k, v in sentence_lengths.items()})))
  return _atomic_write(directory / f"{name}.h5", write)


def bert_paper_sentences(sentences: Sequence[str]) -> list[str]:
  """The official "bert_paper" text: lower case, no trailing dot, "[CLS]" + "... [SEP]".

  Returns one string per sentence (the first carries "[CLS] "), so tokenizing
  each gives the per-sentence token counts of the sentence-splits file.
  """
  out = []
  for i, sentence in enumerate(sentences):
    s = _WHITESPACE.sub(" ", sentence).strip()
    if not s:
      raise ValueError(f"sentence {i} is empty")
    if s.endswith(".") and len(s) > 1 and s[-2] != ".":
      s = s[:-1]
    s = f"{s.strip().lower()} [SEP]"
    out.append(f"[CLS] {s}" if i == 0 else s)
  return out


def encode_paragraphs(paragraphs: Mapping[str, Sequence[str]], *, bert_dir=None,
                      layers: Sequence[int] = (-2, -1), batch_size: int = 16,
                      max_len: int = 512) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
  """Per-token features of each paragraph: our `Bert`'s `layers` hidden states, concatenated.

  bert_dir: a HF BERT-family dir (config.json, vocab.txt, safetensors); None = the
  offline MiniLM-L6 (2 x 384 = 768-d with the default layers). Returns
  ({key: float32 [tokens, D]}, {key: tokens per sentence}).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from avtext.data import preprocessing  # pylint: disable=g-import-not-at-top
  from avtext.weights import assets  # pylint: disable=g-import-not-at-top
  from avtext.weights import bert as bert_weights  # pylint: disable=g-import-not-at-top

  from avtext.models import bert as bert_model  # pylint: disable=g-import-not-at-top
  directory = pathlib.Path(bert_dir) if bert_dir else assets.minilm_l6_dir()
  kwargs, params = bert_weights.load_hf_bert(directory)
  model = bert_model.Bert(**{**kwargs, "return_hidden_states": True, "dropout_rate": 0.0,
                             "attention_dropout_rate": 0.0})
  tokenizer = preprocessing.Tokenizer(directory / "vocab.txt", max_len=max_len)
  keys = list(paragraphs)
  token_ids, lengths = {}, {}
  for key in keys:
    pieces = [tokenizer.wordpiece(s) for s in bert_paper_sentences(paragraphs[key])]
    lengths[key] = [len(p) for p in pieces]
    ids = [i for p in pieces for i in p]
    if len(ids) > max_len:
      raise ValueError(f"paragraph {key!r} has {len(ids)} tokens, more than max_len={max_len}")
    token_ids[key] = ids

  @jax.jit
  def run(ids, mask):
    states = model.apply({"params": params}, ids, mask)["hidden_states"]
    return jnp.concatenate([states[i] for i in layers], axis=-1)

  features = {}
  for start in tqdm(range(0, len(keys), batch_size), desc="text features", unit="batch"):
    chunk = keys[start:start + batch_size]
    longest = max(len(token_ids[k]) for k in chunk)
    width = -(-longest // 16) * 16
    ids = np.zeros((batch_size, width), np.int32)
    mask = np.zeros((batch_size, width), np.int32)
    for row, key in enumerate(chunk):
      ids[row, :len(token_ids[key])] = token_ids[key]
      mask[row, :len(token_ids[key])] = 1
    out = np.asarray(run(ids, mask))
    for row, key in enumerate(chunk):
      features[key] = out[row, :len(token_ids[key])].astype(np.float32)
  return features, lengths

r"""Precomputes what S-MiT's phase 1 keeps frozen, in the `smit_features` layout.

    python -m avtext.features smit --config=configs/smit_language_amm.py:demo \
        --config.init_from.workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/smit_features [--splits=train,val,test] [--batch_size=64] \
        [--reuse=DIR]

Builds the config's model exactly as phase 1 starts it (random init, the text
encoder's pretrained weights, `config.init_from` for the visual backbones), then runs
over each split of `config.features_source` (a clips dataset):

  image_embedding / temporal_embedding   the frozen backbones' pooled outputs
                                         (`VideoModel.backbone_embeddings`, eval mode)
  words                                  the frozen text encoder's per-word features of
                                         the ASR transcript (language models; float16)
  log_mel                                the whole spoken caption's 40-bin log-mel
                                         (float16, as `audio.speech_features`;
                                         not when the source has no spoken captions)
  transcript, caption, ids

and writes <out>/<split>.h5 + <out>/meta.json (layout: avtext/data/builders/smit.py).
A phase-1 run on these features is the phase-1 model on the clips (tested). A finished
directory is reused when the command is the same (--force rebuilds).

The clip side (frames through the backbones, spoken captions through espeak or the
decoder and the log-mel) is computed in batches of --batch_size clips, the next batch's
frames and log-mels on a second thread while the backbones run; the words in a pass of
their own over the transcripts ordered by length, each batch cut to its longest
transcript (rounded up to 8 tokens) instead of data.max_text_len. Every batch has
--batch_size rows (the last one padded), so each function compiles once per length.

--reuse=DIR (a finished smit_features directory of the same clips: the same clips
dataset apart from its transcripts and sizes, the same backbones, init_from and data
settings) computes the words of this config's transcripts only and copies each clip's
clip-side features (backbone embeddings, log-mels) from DIR by clip id: new ASR
transcripts of clips whose features exist (make demo-smit's ASR-text test) cost the text
encoder's pass alone.
"""
from concurrent import futures
import json
import pathlib
import sys

from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np
from tqdm import tqdm

from avtext import atomic
from avtext import cli
from avtext import errors
from avtext.data import audio
from avtext.data import builders
from avtext.data.builders import smit as smit_builder
from avtext.features import done
from avtext.tasks import task_registry
from avtext.train import rundir
from avtext.train import warm_start


FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "an S-MiT config (configs/smit_*.py[:variant]; --config.<field>=<value> "
    "overrides)", lock_config=False, flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the smit_features directory to write", flag_values=FLAGS)
_SPLITS = flags.DEFINE_list("splits", ["train", "val", "test"], "the splits to write",
                            flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "clips per forward pass", lower_bound=1,
                                   flag_values=FLAGS)
_REUSE = cli.DEFINE_path("reuse", None, "a finished smit_features directory of the same "
                         "clips: copy its backbone embeddings and log-mels by clip id and "
                         "compute only the words of this config's transcripts",
                         flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "rebuild even when finished", flag_values=FLAGS)
flags.mark_flags_as_required(["config", "out"], flag_values=FLAGS)

TOKEN_BUCKET = 8  # the words pass pads each batch to a multiple of this many tokens
# What a clip's transcript (not its frames or speech) depends on: --reuse ignores these.
TRANSCRIPT_FIELDS = {
    "origin": ("asr_transcripts", "asr_wer", "asr_substitution_share", "num_train",
               "num_val", "num_eval"),
    "data": ("max_text_len", "vocab"),
}
_EMBEDDINGS = ("image_embedding", "temporal_embedding")


def phase1_variables(config: ml_collections.ConfigDict, task) -> dict:
  """The variables a phase-1 run of `config` starts from (the trainer's init path)."""
  variables = dict(jax.jit(task.init_variables)(jax.random.PRNGKey(config.seed), None))
  params = task.load_pretrained(variables.pop("params"))
  params, variables = warm_start.apply_variables(params, variables, config)
  return {"params": params, **variables}


def _pad_rows(arrays: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """Each [m, ...] array with its last row repeated up to `rows` rows."""
  return {k: np.concatenate([v, np.repeat(v[-1:], rows - len(v), axis=0)]) if len(v) < rows
          else v for k, v in arrays.items()}


def _row(source, index: int) -> dict[str, str]:
  """The clip's id, transcript and caption, without its frames where the source can."""
  desc = source.describe(index) if hasattr(source, "describe") else source[index]
  return {"ids": str(desc.get("clip_id") or f"{index:08d}"),
          "transcript": str(desc.get("transcript", "")), "caption": str(desc.get("caption", ""))}


def _has_speech(source) -> bool:
  return getattr(source, "has_speech", True)  # real S-MiT opened with dataset.spoken=False


def _log_mel(source, index: int, num_mel_bins: int) -> np.ndarray:
  wave = (source.render_speech(index) if hasattr(source, "render_speech")
          else np.asarray(source[index]["spoken_caption"], np.float32))
  return audio.log_mel_spectrogram(audio.to_mono(wave), num_mel_bins=num_mel_bins
                                   ).astype(np.float16)


def clip_side(source, examples, embed, variables, *, batch_size: int, num_mel_bins: int,
              desc: str = "smit_features") -> tuple[dict, dict]:
  """({'image_embedding'/'temporal_embedding': [N, D] float32}, {'ids', 'transcript',
  'caption', 'log_mel': per clip}) of every clip of `source`, in order. The host side of
  batch k + 1 (frames, rows, log-mels) is prepared on a second thread while the
  backbones run on batch k."""
  n = len(source)
  speech = _has_speech(source)

  def host(start: int):
    idx = range(start, min(start + batch_size, n))
    exs = [examples(i) for i in idx]
    frames = {k: np.stack([e[k] for e in exs]) for k in exs[0] if k.endswith("_frames")}
    rows = [_row(source, i) for i in idx]
    mels = [_log_mel(source, i, num_mel_bins) for i in idx] if speech else []
    return _pad_rows(frames, batch_size), len(idx), rows, mels

  emb: dict[str, list] = {}
  cols: dict[str, list] = {"ids": [], "transcript": [], "caption": [], "log_mel": []}
  starts = range(0, n, batch_size)
  with futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(host, 0)
    for start in tqdm(starts, desc=desc, unit="batch"):
      frames, m, rows, mels = pending.result()
      if start + batch_size < n:
        pending = pool.submit(host, start + batch_size)
      for key, value in jax.device_get(embed(variables, frames)).items():
        emb.setdefault(key, []).append(np.asarray(value[:m], np.float32))
      for row in rows:
        for key, value in row.items():
          cols[key].append(value)
      cols["log_mel"].extend(mels)
  return {k: np.concatenate(v) for k, v in emb.items()}, cols


def transcript_words(tokenizer, words_fn, variables, transcripts: list[str], *,
                     batch_size: int, desc: str = "smit_features words") -> list[np.ndarray]:
  """float16 [W_i, D] per transcript: the text encoder's words (`caption_words`), run over
  the transcripts ordered by token count, each batch cut to its longest (rounded up to
  TOKEN_BUCKET tokens, at most the tokenizer's max_len; padding tokens are masked, so
  the words are those of the full-length input)."""
  tokens = tokenizer(list(transcripts), with_words=True)
  lengths = tokens["attention_mask"].sum(axis=1)
  order = np.argsort(lengths, kind="stable")
  max_len = tokens["input_ids"].shape[1]
  out: list = [None] * len(transcripts)
  for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
    idx = order[start:start + batch_size]
    cut = min(max_len, -(-int(lengths[idx].max()) // TOKEN_BUCKET) * TOKEN_BUCKET)
    batch = _pad_rows({k: v[idx, :cut] for k, v in tokens.items()}, batch_size)
    words, mask = jax.device_get(words_fn(variables, batch))
    for j, i in enumerate(idx):
      out[i] = words[j][mask[j]].astype(np.float16)
  return out


def _clip_side_args(args: dict) -> dict:
  """`args` (a DONE record) without what only the transcripts depend on."""
  out = {"origin": dict(args["origin"]), "data": dict(args["data"]),
         "init_from": dict(args["init_from"]),
         "model": {k: args["model"].get(k) for k in ("video", "dtype")}}
  for part, keys in TRANSCRIPT_FIELDS.items():
    for key in keys:
      out[part].pop(key, None)
  return out


def _check_reusable(reuse: pathlib.Path, args: dict) -> None:
  """Raises unless `reuse` is a finished smit_features directory whose clip side was
  computed as `args` would compute it (module docstring: --reuse)."""
  record = reuse / "DONE"
  if not record.is_file():
    raise errors.BadInput(f"--reuse={reuse}: not a finished smit_features directory (no "
                          "DONE); build it first with `python -m avtext.features smit`")
  theirs, ours = _clip_side_args(json.loads(record.read_text())), _clip_side_args(args)
  differ = [f"{part}.{key}" for part in ours
            for key in sorted(set(ours[part]) | set(theirs[part]))
            if ours[part].get(key) != theirs[part].get(key)]
  if differ:
    raise errors.BadInput(f"--reuse={reuse}: its clip-side features were computed with "
                          f"other settings ({', '.join(differ)} differ); build without --reuse")


def _reused(reuse: pathlib.Path, split: str, ids: list[str]) -> dict:
  """{'image_embedding' / 'temporal_embedding': [N, D], 'log_mel': per clip} of the clips
  `ids`, copied from `reuse`'s split."""
  have = smit_builder.SMiTFeatures(str(reuse), split)
  where = {clip: i for i, clip in enumerate(have.ids)}
  missing = [clip for clip in ids if clip not in where]
  if missing:
    raise errors.BadInput(f"--reuse={reuse}: {split}.h5 lacks {len(missing)} of the "
                          f"{len(ids)} clips (first: {missing[0]!r}); build it over these clips "
                          "(sizes at least this config's) or build without --reuse")
  rows = np.array([where[clip] for clip in ids], np.int64)
  out = {key: have.arrays[key][rows] for key in _EMBEDDINGS if key in have.arrays}
  if "log_mel" in have.arrays:
    offsets = have.arrays["log_mel_offsets"]
    out["log_mel"] = [have.arrays["log_mel"][offsets[r]:offsets[r + 1]] for r in rows]
  return out


def extract(config: ml_collections.ConfigDict, out: str | pathlib.Path, *,
            splits=("train", "val", "test"), batch_size: int = 64, force: bool = False,
            reuse: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes the smit_features directory `out` (module docstring); returns it."""
  import h5py  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(out)
  origin = config.get("features_source")
  if not origin:
    raise ValueError("config.features_source: the clips dataset to compute features from "
                     "is unset (see configs/smit_language_amm.py)")
  args = {"origin": origin.to_dict(), "model": config.model.to_dict(),
          "init_from": config.init_from.to_dict(), "data": config.data.to_dict(),
          "splits": list(splits)}
  if reuse is not None:
    reuse = pathlib.Path(reuse)
    args["reuse"] = str(reuse.absolute())
  args = json.loads(json.dumps(args, default=list))  # as DONE stores it (tuples -> lists)
  out.mkdir(parents=True, exist_ok=True)
  if done.reuse_finished(out, args, force):
    return out
  if config.model.video.get("train_backbones"):
    raise ValueError("smit_features: config.model.video.train_backbones is True (phase 2); "
                     "features are for phase 1, whose backbones are frozen")
  if reuse is None and not warm_start.configured(config):
    logging.warning("config.init_from.workdir is unset: the backbones are random")
  if reuse is not None:
    _check_reusable(reuse, args)
  task = task_registry.build_task(config)
  sources = {split: task.check_source(builders.get_source(origin, split)) for split in splits}
  copied = {}  # with --reuse, each split's rows and clip side, checked before any compute
  if reuse is not None:
    for split, source in sources.items():
      rows = [_row(source, i) for i in range(len(source))]
      cols = {key: [r[key] for r in rows] for key in ("ids", "transcript", "caption")}
      emb = _reused(reuse, split, cols["ids"])
      cols["log_mel"] = emb.pop("log_mel", [])
      copied[split] = emb, cols
  variables = phase1_variables(config, task)
  fns = task.predict_fns()
  language = config.model.caption == "language"
  embed = jax.jit(fns["backbone_embeddings"])
  words_fn = jax.jit(fns["caption_words"]) if language else None
  counts = {}
  for split, source in sources.items():
    n = len(source)
    if reuse is None:
      emb, cols = clip_side(source, task.examples(source, train=False), embed, variables,
                            batch_size=batch_size, num_mel_bins=config.data.num_mel_bins,
                            desc=f"smit_features {split}")
    else:
      emb, cols = copied.pop(split)
    if language:
      cols["words"] = transcript_words(task.tokenizer, words_fn, variables, cols["transcript"],
                                       batch_size=batch_size, desc=f"smit_features {split} words")

    def write(tmp: pathlib.Path) -> None:
      with h5py.File(tmp, "w") as f:
        string = h5py.string_dtype()
        for key in ("ids", "transcript", "caption"):
          f.create_dataset(key, data=np.array(cols[key], dtype=object), dtype=string)
        for key, value in emb.items():
          f.create_dataset(key, data=value)
        for key in ("words", "log_mel"):
          if cols.get(key):
            f.create_dataset(key, data=np.concatenate(cols[key]))
            f.create_dataset(f"{key}_offsets", data=np.concatenate(
                [[0], np.cumsum([len(x) for x in cols[key]])]).astype(np.int64))
    atomic.replace_with(out / f"{split}.h5", write)
    counts[split] = n
    logging.info("smit_features: %s: %d clips -> %s", split, n, out / f"{split}.h5")
  atomic.write_text(out / "meta.json", json.dumps(
      {"format": smit_builder.FORMAT, "splits": counts, "origin": origin.to_dict(),
       "model": config.model.to_dict(), "init_from": config.init_from.to_dict(),
       **({"reused": args["reuse"]} if reuse is not None else {})},
      indent=1, default=list))
  done.mark_finished(out, args)
  return out


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  cli.log_progress()
  cli.check_output_dir("out", _OUT.value)
  with rundir.output_lock(_OUT.value, "out"):
    out = extract(config, _OUT.value, splits=tuple(_SPLITS.value),
                  batch_size=_BATCH_SIZE.value, force=_FORCE.value, reuse=_REUSE.value)
  print(f"features written to {out}")


if __name__ == "__main__":  # python -m avtext.features.smit: as python -m avtext.features smit
  cli.run(main, FLAGS, [f"python -m avtext.features smit"] + sys.argv[1:], doc=__doc__)

r"""Precomputes what S-MiT's phase 1 keeps frozen, in the `smit_features` layout.

    python -m avtext.features smit --config=configs/smit_language_amm.py:demo \
        --config.init_from.workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/smit_features [--splits=train,val,test] [--batch_size=64]

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
"""
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

from avtext import cli
from avtext import errors
from avtext.data import audio
from avtext.data import builders
from avtext.data.builders import smit as smit_builder
from avtext.features import done
from avtext.tasks import registry
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
_FORCE = flags.DEFINE_bool("force", False, "rebuild even when finished", flag_values=FLAGS)
flags.mark_flags_as_required(["config", "out"], flag_values=FLAGS)


def phase1_variables(config: ml_collections.ConfigDict, task) -> dict:
  """The variables a phase-1 run of `config` starts from (the trainer's init path)."""
  variables = dict(jax.jit(task.init_variables)(jax.random.PRNGKey(config.seed), None))
  params = task.load_pretrained(variables.pop("params"))
  params, variables = warm_start.apply_variables(params, variables, config)
  return {"params": params, **variables}


def extract(config: ml_collections.ConfigDict, out: str | pathlib.Path, *,
            splits=("train", "val", "test"), batch_size: int = 64, force: bool = False
            ) -> pathlib.Path:
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
  args = json.loads(json.dumps(args, default=list))  # as DONE stores it (tuples -> lists)
  out.mkdir(parents=True, exist_ok=True)
  if done.reuse_finished(out, args, force):
    return out
  if config.model.video.get("train_backbones"):
    raise ValueError("smit_features: config.model.video.train_backbones is True (phase 2); "
                     "features are for phase 1, whose backbones are frozen")
  if not warm_start.configured(config):
    logging.warning("config.init_from.workdir is unset: the backbones are random")
  task = registry.build_task(config)
  variables = phase1_variables(config, task)
  fns = task.predict_fns()
  language = config.model.caption == "language"
  embed = jax.jit(fns["backbone_embeddings"])
  words_fn = jax.jit(fns["caption_words"]) if language else None
  counts = {}
  for split in splits:
    source = task.check_source(builders.get_source(origin, split))
    examples = task.examples(source, train=False)
    n = len(source)
    cols: dict[str, list] = {"ids": [], "transcript": [], "caption": [], "words": [],
                             "log_mel": []}
    emb: dict[str, list] = {}
    for start in tqdm(range(0, n, batch_size), desc=f"smit_features {split}", unit="batch"):
      idx = list(range(start, min(start + batch_size, n)))
      exs = [examples(i) for i in idx]
      batch = {k: np.stack([e[k] for e in exs]) for k in exs[0]
               if isinstance(exs[0][k], np.ndarray)}
      for key, value in jax.device_get(embed(variables, batch)).items():
        emb.setdefault(key, []).append(np.asarray(value, np.float32))
      if language:
        words, mask = jax.device_get(words_fn(variables, batch))
        cols["words"].extend(w[m].astype(np.float16) for w, m in zip(words, mask))
      for i, ex in zip(idx, exs):
        desc = source.describe(i) if hasattr(source, "describe") else source[i]
        cols["ids"].append(ex["clip_id"])
        cols["transcript"].append(str(desc.get("transcript", "")))
        cols["caption"].append(str(desc.get("caption", "")))
        if not getattr(source, "has_speech", True):
          continue  # real S-MiT opened without its spoken captions (dataset.spoken=False)
        wave = (source.render_speech(i) if hasattr(source, "render_speech")
                else np.asarray(source[i]["spoken_caption"], np.float32))
        mel = audio.log_mel_spectrogram(
            audio.to_mono(wave), num_mel_bins=config.data.num_mel_bins)
        cols["log_mel"].append(mel.astype(np.float16))
    tmp = out / f"{split}.h5.tmp"
    with h5py.File(tmp, "w") as f:
      string = h5py.string_dtype()
      for key in ("ids", "transcript", "caption"):
        f.create_dataset(key, data=np.array(cols[key], dtype=object), dtype=string)
      for key, parts in emb.items():
        f.create_dataset(key, data=np.concatenate(parts))
      for key in ("words", "log_mel"):
        if cols[key]:
          f.create_dataset(key, data=np.concatenate(cols[key]))
          f.create_dataset(f"{key}_offsets", data=np.concatenate(
              [[0], np.cumsum([len(x) for x in cols[key]])]).astype(np.int64))
    tmp.rename(out / f"{split}.h5")
    counts[split] = n
    logging.info("smit_features: %s: %d clips -> %s", split, n, out / f"{split}.h5")
  (out / "meta.json").write_text(json.dumps(
      {"format": smit_builder.FORMAT, "splits": counts, "origin": origin.to_dict(),
       "model": config.model.to_dict(), "init_from": config.init_from.to_dict()},
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
                  batch_size=_BATCH_SIZE.value, force=_FORCE.value)
  print(f"features written to {out}")


if __name__ == "__main__":  # python -m avtext.features.smit: as python -m avtext.features smit
  cli.run(main, FLAGS, [f"python -m avtext.features smit"] + sys.argv[1:], doc=__doc__)

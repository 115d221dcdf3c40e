r"""Transcribes an S-MiT config's spoken captions with a real ASR engine, once.

    python -m avworld.tools.smit_asr --config=configs/smit_language_amm.py:demo,asr \
        [--out=workdirs/demo/smit_asr] [--splits=test] [--lm=train] [--num_workers=N]

For each split of `config.features_source` (a synthetic_smit clips dataset, speech
rendered as it says: dataset.speech='espeak' for real speech) every clip's spoken
caption is rendered and decoded by pocketsphinx (`avtext.data.asr.Recognizer`),
in --num_workers processes (default: one per core). Written to <out>:

  lm/lm.arpa, lm/words.dict   with --lm=train (the default): the trigram language model
                              and dictionary of the TRAIN split's captions (all
                              config.features_source.num_train of them; never a val or
                              test caption); --lm=general: the wheel's English model
  <split>.json                {"transcripts": [...] in clip order, "wer": corpus WER
                              against the captions, "num_clips", "num_words", "lm"}

Point `dataset.asr_transcripts` (synthetic_smit) at <out> and a source's 'transcript'
is the engine's (then `python -m avtext.features smit` writes their word features).
Why the training-caption language model: with the wheel's general English model the
engine gets most words of the rendered captions wrong (WER 79.4 % on 40 test clips,
against 11.3 % on 300 with the training-caption model; BENCHMARKS.md "S-MiT"); a domain
model fitted on training text is what one deploys on captions of a known domain, and no
test caption enters it. A finished directory is reused when
the arguments are the same (--force redoes it).
"""
import json
import multiprocessing
import os
import pathlib
import time

from absl import flags
import ml_collections
from ml_collections import config_flags

from avtext import atomic
from avtext import cli
from avtext import errors
from avtext.data import asr
from avtext.data import builders
from avtext.features import done

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "an S-MiT config whose features_source is synthetic_smit "
    "(configs/smit_language_amm.py:demo,asr)", lock_config=False, flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the directory to write (default: "
                       "config.features_source.asr_transcripts, where the features read it)",
                       flag_values=FLAGS)
_SPLITS = flags.DEFINE_list("splits", ["test"], "the splits to transcribe", flag_values=FLAGS)
_LM = flags.DEFINE_enum("lm", "train", ["train", "general"], "the language model: train "
                        "(a trigram of the training captions) or general (the wheel's English "
                        "model)", flag_values=FLAGS)
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "processes (default: one per core)",
                                    lower_bound=1, flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "redo even when finished", flag_values=FLAGS)
flags.mark_flags_as_required(["config"], flag_values=FLAGS)

_WORKER = {}  # per worker process: the sources and the recognizer


def _init(origin: dict, lm_dir: str | None) -> None:
  _WORKER["origin"] = ml_collections.ConfigDict(origin)
  _WORKER["sources"] = {}
  _WORKER["lm_dir"] = lm_dir


def _source(split: str):
  if split not in _WORKER["sources"]:
    _WORKER["sources"][split] = builders.get_source(_WORKER["origin"], split)
  return _WORKER["sources"][split]


def _caption(job: tuple[str, int]) -> str:
  split, i = job
  return _source(split).describe(i)["caption"]


def _transcribe(job: tuple[str, int]) -> tuple[str, str]:
  """(caption, what the engine heard in its speech) of clip `job`."""
  split, i = job
  if "recognizer" not in _WORKER:
    _WORKER["recognizer"] = asr.Recognizer(_WORKER["lm_dir"])
  source = _source(split)
  return source.describe(i)["caption"], _WORKER["recognizer"].transcribe(source.render_speech(i))


def transcribe(origin: ml_collections.ConfigDict, out: str | os.PathLike, *,
               splits=("test",), lm: str = "train", num_workers: int | None = None,
               force: bool = False) -> dict[str, float]:
  """Writes <out> (module docstring); returns each split's WER."""
  out = pathlib.Path(out)
  if origin.get("name") != "synthetic_smit" or origin.get("speech", "tones") != "espeak":
    raise ValueError(f"config.features_source: name={origin.get('name')!r}, "
                     f"speech={origin.get('speech')!r}; the ASR engine transcribes the "
                     f"synthetic S-MiT's real speech: set name='synthetic_smit', "
                     f"speech='espeak' (configs/smit_language_amm.py:demo,asr)")
  origin = ml_collections.ConfigDict(origin.to_dict())
  origin.asr_transcripts = None  # what this writes; the engine reads the speech
  args = json.loads(json.dumps({"origin": origin.to_dict(), "splits": list(splits), "lm": lm},
                               default=list))
  out.mkdir(parents=True, exist_ok=True)
  if done.reuse_finished(out, args, force):
    return {s: json.loads((out / f"{s}.json").read_text())["wer"] for s in splits}
  sizes = {s: len(builders.get_source(origin, s)) for s in ("train", *splits)}
  lm_dir = str(out / "lm") if lm == "train" else None
  ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
  with ctx.Pool(num_workers or os.cpu_count(), _init, (origin.to_dict(), lm_dir)) as pool:
    if lm_dir:
      train = pool.map(_caption, [("train", i) for i in range(sizes["train"])], chunksize=64)
      asr.build_language_model(train, lm_dir)
      print(f"smit_asr: language model of the {len(train)} train captions -> {lm_dir}",
            flush=True)
    wers = {}
    for split in splits:
      n, start = sizes[split], time.time()
      jobs = [(split, i) for i in range(n)]
      refs, hyps = zip(*pool.map(_transcribe, jobs, chunksize=16))
      wers[split] = asr.word_error_rate(refs, hyps)
      num_words = sum(len(asr.words(r)) for r in refs)
      atomic.write_text(out / f"{split}.json", json.dumps(
          {"transcripts": list(hyps), "wer": wers[split], "num_clips": n, "num_words": num_words,
           "lm": f"trigram of {sizes['train']} train captions" if lm_dir else "general"}))
      print(f"smit_asr: {split}: WER {100 * wers[split]:.1f} % over {num_words} words of "
            f"{n} clips ({time.time() - start:.0f} s)", flush=True)
  done.mark_finished(out, args)
  return wers


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  out = _OUT.value or config.features_source.get("asr_transcripts")
  if not out:
    raise errors.BadInput("--out is unset and so is config.features_source.asr_transcripts: "
                          "name the directory to write")
  transcribe(config.features_source, out, splits=tuple(_SPLITS.value), lm=_LM.value,
             num_workers=_NUM_WORKERS.value, force=_FORCE.value)


if __name__ == "__main__":
  cli.run(main, FLAGS)

"""The files TVR's and TVC's evaluation servers take, from the evaluators' exports.

The official READMEs (jayleicn/TVRetrieval and jayleicn/TVCaption,
standalone_eval/README.md, "Codalab Submission") ask for one .zip, without an
enclosing folder, of two prediction files:

  TVR   tvr_val_submission.json and tvr_test_public_submission.json: the `moments`
        evaluator's submission JSON (video2idx, VCMR, SVMR, VR); the test_public file
        without SVMR (its ground-truth videos are hidden)
  TVC   tvc_val_submission.jsonl and tvc_test_public_submission.jsonl: the `captioning`
        evaluator's TVCaption jsonl (`output_format="tvc"`)

Whenever an evaluator of the run writes its export of split val or test_public at a
step and the other split's export of that step is there too (a run's last evaluation,
`--mode=eval`), both are written under their official names into
`<workdir>/submission/step<N>/` with `<kind>_submission.zip` beside them, ready to
upload. `package` does the same for exports written earlier.
"""
import json
import pathlib
import shutil
import zipfile

from avtext import atomic

SPLITS = ("val", "test_public")
# The exports this process wrote: an evaluator's zip pairs two of them, never one left in
# the run by an earlier evaluation of the same step.
_WRITTEN: set[pathlib.Path] = set()
# evaluator type -> (the official prefix, the export's folder and suffix)
KINDS = {"moments": ("tvr", "moments", ".json"), "captioning": ("tvc", "captions", ".jsonl")}
FOLDER = "submission"


def official_name(kind: str, split: str) -> str:
  prefix, _, suffix = KINDS[kind]
  return f"{prefix}_{split}_submission{suffix}"


def exports(config, workdir, step: int, kind: str) -> dict[str, pathlib.Path]:
  """{split: the export file at `step`} of the evaluators of type `kind` (captioning: in
  TVC's format) that read val or test_public; only the files that exist."""
  _, folder, suffix = KINDS[kind]
  out = {}
  for name, cfg in (config.get("evals") or {}).items():
    split = cfg.get("split", "test")
    if cfg.get("type") != kind or split not in SPLITS or split in out:
      continue
    if kind == "captioning" and cfg.get("output_format") != "tvc":
      continue
    path = pathlib.Path(workdir) / folder / f"{name}_step{step}{suffix}"
    if path.is_file():
      out[split] = path
  return out


def package(config, workdir, step: int, kind: str,
            written: pathlib.Path | None = None) -> pathlib.Path | None:
  """The zip to upload (and the two official files beside it) of step `step`, once both
  splits' exports are there; None before. `written`: the export an evaluator has just
  written; then both must be this process's."""
  found = exports(config, workdir, step, kind)
  if written is not None:
    _WRITTEN.add(pathlib.Path(written).absolute())
  if set(found) != set(SPLITS) or (written is not None and any(
      path.absolute() not in _WRITTEN for path in found.values())):
    return None
  folder = pathlib.Path(workdir) / FOLDER / f"step{step}"
  folder.mkdir(parents=True, exist_ok=True)
  files = []
  for split, export in found.items():
    target = folder / official_name(kind, split)
    if kind == "moments" and split == "test_public":
      sub = json.loads(export.read_text(encoding="utf-8"))
      sub.pop("SVMR", None)  # "tvr_test_public_submission.json will have only 3 entries"
      atomic.write_text(target, json.dumps(sub))
    else:
      atomic.replace_with(target, lambda tmp, src=export: shutil.copyfile(src, tmp))
    files.append(target)

  def write_zip(tmp):
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
      for file in files:
        archive.write(file, arcname=file.name)  # at the root: no enclosing folder
  return atomic.replace_with(folder / f"{KINDS[kind][0]}_submission.zip", write_zip)

r"""Which attributes does a trained AVR run encode? Linear probes per tower.

    python -m benchmarks.analyses.avr_probes --workdir=workdirs/demo/avr [--num_train=3000]

Embeds `num_train` clips of the synthetic train split and the test split with
the run's model (K-clip-averaged video embeddings, caption embeddings), fits a
ridge-regression probe per attribute on the train embeddings and prints its
test accuracy:
  video: shape / motion / colour of single-object clips, background, sound;
  text: shape / motion / colour of captions that describe one object.
It also prints the oracle t2v R@1 with words about shape and/or motion
ignored: the best R@1 a model blind to those attributes can reach. Together
they say which tower to work on when R@1 falls short of the oracle. --quick: 200 train
clips. Rows: each probe's accuracy (chance as its peer) and each oracle.
"""
import copy

from absl import flags
import jax
import numpy as np

from avtext import runs
from avtext.data import builders
from avtext.evals import base as eval_base
from avtext.train import partitioning
from avworld import captions
from avworld import clips as clips_lib
from avworld import world
from benchmarks import common

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (synthetic_clips dataset)",
                               required=True)
_NUM_TRAIN = flags.DEFINE_integer("num_train", 3000, "train clips to fit the probes on")

SYSTEM = "VideoCC AVR"
_OBJECT_FIELDS = (("shape", world.SHAPES), ("motion", world.MOTION_NAMES),
                  ("colour", world.COLOUR_NAMES))


def probe_accuracy(x_train, y_train, x_test, y_test, num_classes, l2=1e-2) -> float:
  """Test accuracy (%) of a ridge-regression one-vs-rest probe; labels < 0 are skipped."""
  keep_tr, keep_te = y_train >= 0, y_test >= 0
  x = np.c_[x_train[keep_tr], np.ones(keep_tr.sum())]
  w = np.linalg.solve(x.T @ x + l2 * np.eye(x.shape[1]),
                      x.T @ np.eye(num_classes)[y_train[keep_tr]])
  pred = np.argmax(np.c_[x_test[keep_te], np.ones(keep_te.sum())] @ w, axis=1)
  return float(100.0 * np.mean(pred == y_test[keep_te]))


def _clip_labels(attrs, field, names):
  return np.array([names.index(a["objects"][0][field]) if a["num_objects"] == 1 else -1
                   for a in attrs])


def _caption_labels(attrs, field, names):
  out = []
  for a in attrs:
    objs = a["mentioned"]["objects"]
    out.append(names.index(objs[0][field]) if len(objs) == 1 and field in objs[0] else -1)
  return np.array(out)


def _ignoring(mention, fields):
  m = copy.deepcopy(mention)
  m["objects"] = [d for d in ({f: v for f, v in o.items() if f not in fields}
                              for o in m["objects"]) if d]
  return m


def main(argv):
  del argv
  run = runs.load_run(_WORKDIR.value)
  task = run.task()
  mesh = partitioning.make_mesh(None, 1)
  fns = task.predict_fns()
  encode = jax.jit(lambda v, b: (fns["embed_text"](v, b), fns["embed_video"](v, b)))
  test = builders.get_source(run.config.dataset, "test")
  if not isinstance(test, clips_lib.ClipCaptionSource):
    raise SystemExit(f"{_WORKDIR.value}: probes need the synthetic_clips dataset")
  train = clips_lib.ClipCaptionSource("train", num_examples=200 if common.quick() else
                                      _NUM_TRAIN.value,
                                      spec=test.spec, seed=test.seed)
  emb, attrs = {}, {}
  for name, source in (("train", train), ("test", test)):
    (text, video), _ = eval_base.map_examples(
        lambda batch: encode(run.variables, batch), task.eval_examples(source), len(source),
        mesh=mesh, global_batch_size=run.config.eval.batch_size)
    video = video.mean(axis=1)
    emb[name] = {"text": text, "video": video / np.linalg.norm(video, axis=1, keepdims=True)}
    attrs[name] = [source.describe(i)["attributes"] for i in range(len(source))]

  print(f"linear probes, run {_WORKDIR.value} step {run.step} "
        f"({len(train)} train / {len(test)} test clips)")
  table = f"ridge probes on the run's embeddings, {len(train)} train / {len(test)} test clips"
  rows = []
  for field, names in _OBJECT_FIELDS:
    rows.append((f"video {field} (1-object clips)", "video", _clip_labels, field, names))
  for key, names in (("background", world.BACKGROUNDS), ("sound", world.SOUNDS)):
    rows.append((f"video {key}", "video", None, key, names))
  for field, names in _OBJECT_FIELDS:
    rows.append((f"text {field} (1-object captions)", "text", _caption_labels, field, names))
  for label, tower, fn, key, names in rows:
    if fn is None:
      y = {s: np.array([names.index(a[key]) for a in attrs[s]]) for s in attrs}
    else:
      y = {s: fn(attrs[s], key, names) for s in attrs}
    acc = probe_accuracy(emb["train"][tower], y["train"], emb["test"][tower], y["test"],
                         len(names))
    print(f"  {label:32s} {acc:5.1f} %   (chance {100 / len(names):.0f} %)")
    common.record(SYSTEM, label, acc, unit="%", table=table, peer=100 / len(names),
                  peer_name="chance", digits=3)

  clip_attrs = [{k: a[k] for k in ("num_objects", "objects", "background", "sound")}
                for a in attrs["test"]]
  print("oracle t2v R@1 when the model ignores some words:")
  for fields in ((), ("shape",), ("motion",), ("shape", "motion")):
    n = captions.num_fitting_clips([_ignoring(a["mentioned"], fields) for a in attrs["test"]],
                                   clip_attrs)
    oracle = captions.oracle_recall_at_1(n)
    print(f"  ignoring {'+'.join(fields) or 'nothing':14s} {oracle:6.2f}")
    common.record(SYSTEM, f"ignoring {' and '.join(fields) or 'nothing'}", oracle,
                  table="oracle t2v R@1 of a model blind to some words", digits=3)


if __name__ == "__main__":
  common.main(main)

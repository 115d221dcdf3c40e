"""`Task.example_spec` / `batch_spec` (the abstract inputs of ahead-of-time compilation)
against the real pipelines: for every task's tiny config, a real training batch and the
examples every evaluator of the config feeds each predict function it calls, key by key;
the abstract batches trace through init, loss_fn and those predict functions; and the
specs open no dataset (paper configs and missing paths included)."""
import inspect
import sys

import jax
import numpy as np
import pytest

from avtext import evals
from avtext.data import builders
from avtext.evals import base
from avtext.features import coot_text
from avtext.features import smit as smit_features
from avtext.inference import vcmr
from avtext.tasks import coot as coot_task
from avtext.tasks import task_registry
from avtext.text import vocab as vocab_lib
from tests.test_train_trainer import REPO

sys.path.insert(0, str(REPO / "configs"))
# pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
import coot_activitynet
import mmt_tvc
import smit_language_amm
import smit_spoken_amm
import synthetic_video_pretrain
import videocc_avr
import videocc_caption
import xml_tvr
from test_tasks_coot import tiny_config as coot_tiny_config
from test_tasks_coot import write_tiny_dataset as write_coot_dataset
from test_tasks_mmt import _tiny_config as mmt_tiny_config
from test_tasks_mmt import tvc_dir  # noqa: F401  (a fixture)
from test_tasks_xml import _dataset_config as tvr_dataset_config
from test_tasks_xml import tvr_dir  # noqa: F401  (a fixture)
# pylint: enable=g-import-not-at-top,wrong-import-position,g-bad-import-order

BATCH = 2  # rows of the real batches compared


def _sds(x) -> jax.ShapeDtypeStruct:
  x = np.asarray(x)
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _arrays(example: dict) -> dict:
  """The fields `map_examples` sends to the devices (its own rule), as shapes."""
  on_device = base._on_device  # pylint: disable=protected-access
  return {k: _sds(v) for k, v in example.items() if on_device(v)}


def _shapes(batch: dict) -> dict:
  return {k: _sds(v) for k, v in batch.items()}


def _unbatched(batch: dict) -> dict:
  return {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in _shapes(batch).items()}


def _fits(real: dict, spec: dict) -> None:
  """Same keys, dtypes and ranks; every axis of `real` at most the spec's (padded data)."""
  assert real.keys() == spec.keys()
  for k, s in spec.items():
    r = real[k]
    assert r.dtype == s.dtype and len(r.shape) == len(s.shape), (k, r, s)
    assert all(a <= b for a, b in zip(r.shape, s.shape)), (k, r, s)


def _predict_fn_names(ev) -> tuple[str, ...]:
  """The task predict functions evaluator `ev` calls (see avtext/evals/*)."""
  cfg = ev.cfg
  kind = cfg.type
  if kind == "retrieval":
    return cfg.get("text_fn", "embed_text"), cfg.get("video_fn", "embed_video")
  if kind == "classification":
    return (cfg.get("logits_fn", "logits"),)
  if kind == "hierarchical":
    return (cfg.get("embed_fn", "embed"),)
  if kind == "captioning":
    return (cfg.get("captions_fn", "captions"),)
  if kind == "moments":
    return ("encode_query", "encode_context", "span_logits")
  raise AssertionError(f"evaluator type {kind!r}: add its predict functions here")


def _examples_for(task, ev, name: str):
  if name == "encode_context":  # the moments evaluator encodes the corpus
    return task.corpus_examples(ev.source)
  return task.eval_examples(ev.source)


def _call_loss(task, variables, batch):
  rng = jax.random.PRNGKey(0)
  if task.loss_needs_step:
    return task.loss_fn(variables, batch, rng, step=0)
  return task.loss_fn(variables, batch, rng)


def check_task(config, tmp_path, *, packed: bool = False) -> None:
  """Real train batch and eval examples == the specs; the abstract batches trace.

  packed: batches are not stacked examples (COOT): the real arrays fit the spec's
  maximum lengths instead of equalling them.
  """
  task = task_registry.build_task(config)
  # ---- training: batch 0 of the real stream
  batch = task.train_data(batch_size=BATCH, seed=0, process_index=0, process_count=1)[0]
  spec = task.batch_spec(BATCH, train=True)
  if packed:
    _fits(_shapes(batch), spec)
    examples = [task.example(task.train_source[i], np.random.default_rng(0))
                for i in range(BATCH)]
    for ex in examples:
      _fits(_arrays(ex), task.example_spec(train=True))
  else:
    assert _unbatched(batch) == task.example_spec(train=True)
    assert _shapes(batch) == spec
  # ---- the abstract batches trace through the model
  rng = jax.random.PRNGKey(0)
  variables = jax.eval_shape(task.init_variables, rng, spec)
  jax.eval_shape(lambda v, b: _call_loss(task, v, b), variables, spec)
  fns = task.predict_fns()
  # ---- evaluation: each evaluator's source, through the predict functions it calls
  evaluators = evals.build_evaluators(config, task, workdir=tmp_path)
  assert evaluators
  outputs = {}
  for ev in evaluators.values():
    for name in _predict_fn_names(ev):
      if name == "span_logits":  # fed the encoded corpus and queries; checked below
        continue
      examples = _examples_for(task, ev, name)
      rows = [examples(i) for i in range(BATCH)]
      collate = getattr(task, "collate", None) or base.stack_examples
      real = collate([{k: r[k] for k in _arrays(r)} for r in rows])
      spec = task.batch_spec(BATCH, train=False, predict_fn=name)
      if packed:
        for r in rows:
          _fits(_arrays(r), task.predict_example_spec(name))
        _fits(_shapes(real), spec)
      else:
        for r in rows:
          assert _arrays(r) == task.predict_example_spec(name), name
        assert _shapes(real) == spec, name
      outputs[name] = jax.eval_shape(fns[name], variables, spec)
  if "encode_context" in outputs:  # the moments evaluator
    check_span_spec(task, variables, fns, outputs, tmp_path)


def check_span_spec(task, variables, fns, outputs, tmp_path) -> None:
  """span_logits' spec is one (query, video) row of encode_query's and encode_context's
  outputs, with the mask dtype of the corpus store `vcmr.search` reads it from."""
  q, ctx = outputs["encode_query"]["q"], outputs["encode_context"]
  want = {"q": q.shape[1:], "h1": ctx["h1"].shape[1:], "mask": ctx["mask"].shape[1:]}
  spec = task.predict_example_spec("span_logits")
  assert {k: v.shape for k, v in spec.items()} == want
  m, length, dim = ctx["h1"].shape[1:]
  writer = vcmr.CorpusWriter(tmp_path / "corpus", num_videos=1, streams=task.streams, dim=dim,
                             max_len=length)
  writer.add(["v"], [0], np.zeros((1, m, length, dim)), np.zeros((1, m, length, dim)),
             np.ones((1, length), np.int32))
  store = writer.close()
  assert np.asarray(store.mask[[0]]).dtype == spec["mask"].dtype
  assert spec["q"].dtype == q.dtype and spec["h1"].dtype == np.float32
  jax.eval_shape(fns["span_logits"], variables, task.batch_spec(BATCH, train=False,
                                                                predict_fn="span_logits"))


# ---------------------------------------------------------------- clip tasks (synthetic world)


@pytest.mark.parametrize("variant", ["tiny", "tiny,rgb"])
def test_avr(tmp_path, variant):
  check_task(videocc_avr.get_config(variant), tmp_path)


def test_tasks_classification(tmp_path):
  check_task(synthetic_video_pretrain.get_config("tiny"), tmp_path)


def test_gpt2_captioning(tmp_path):
  config = videocc_caption.get_config("tiny")
  config.model.decoder.vocab_size = 50257  # the full GPT-2 vocabulary, no subset file
  config.evals.test.baselines = {}  # the baselines read other runs, not the task's specs
  check_task(config, tmp_path)


# ---------------------------------------------------------------- feature tasks


def test_mmt_captioning(tmp_path, tvc_dir):  # noqa: F811
  src = builders.get_source(mmt_tiny_config(tvc_dir, tmp_path / "w.json").dataset, "train")
  vocab_lib.WordVocab.build([d for i in range(len(src)) for d in src.describe(i)["descs"]],
                            min_count=0).save(tmp_path / "w.json")
  config = mmt_tiny_config(tvc_dir, tmp_path / "w.json")
  config.evals.test.baselines = {}
  check_task(config, tmp_path)


def test_xml_moments(tmp_path, tvr_dir):  # noqa: F811
  config = xml_tvr.get_config("tiny")
  config.dataset = tvr_dataset_config(tvr_dir)
  config.evals.test.baselines = {}
  check_task(config, tmp_path)


def test_coot(tmp_path):
  write_coot_dataset(tmp_path / "coot", num_train=4, num_val=2)
  config = coot_tiny_config(tmp_path / "coot")
  check_task(config, tmp_path, packed=True)
  # The paragraph bound is the text tool's cut.
  default = inspect.signature(coot_text.encode_paragraphs).parameters["max_len"].default
  assert coot_task.MAX_PARAGRAPH_TOKENS == default
  # A fixed clip axis: the rows of every batch are exactly max_clips_per_batch.
  config.data.max_clips_per_batch = 24
  task = task_registry.build_task(config)
  batch = task.train_data(batch_size=BATCH, seed=0, process_index=0, process_count=1)[0]
  spec = task.batch_spec(BATCH, train=True)
  assert batch["clips"].shape[0] == spec["clips"].shape[0] == 24
  assert task.batch_spec(4 * BATCH, train=True, process_count=4)["clips"].shape[0] == 96


# ---------------------------------------------------------------- S-MiT: clips and features


def _smit_small(config):
  src = config.features_source
  src.num_train, src.num_val, src.num_eval = 4, 4, 4
  if "test" in config.evals:
    config.evals.test.subset_protocol = None
  return config


@pytest.mark.parametrize("module", [smit_language_amm, smit_spoken_amm],
                         ids=["language", "spoken"])
def test_smit_phase2_clips(tmp_path, module):
  config = _smit_small(module.get_config("tiny,phase2"))
  config.dataset = config.features_source
  check_task(config, tmp_path)


@pytest.mark.parametrize("module", [smit_language_amm,
                                    pytest.param(smit_spoken_amm, marks=pytest.mark.slow)],
                         ids=["language", "spoken"])
def test_smit_phase1_features(tmp_path, module):
  config = _smit_small(module.get_config("tiny"))
  config.dataset.path = str(smit_features.extract(config, tmp_path / "features",
                                                  splits=("train", "val", "test"),
                                                  batch_size=4))
  check_task(config, tmp_path)


# ---------------------------------------------------------------- from the config alone


def _no_dataset(*args, **kwargs):
  raise AssertionError(f"example_spec opened a dataset: get_source{args}")


def _configs(tmp_path):
  """Every task's paper and tiny configs, dataset paths pointing nowhere."""
  missing = str(tmp_path / "does_not_exist")
  vocab = tmp_path / "w.json"
  vocab_lib.WordVocab.build(["a few words"], min_count=0).save(vocab)
  out = {}
  for name, module, arg in (("avr", videocc_avr, ""), ("avr_tiny", videocc_avr, "tiny"),
                            ("video_cls", synthetic_video_pretrain, ""),
                            ("gpt2_caption", videocc_caption, ""),
                            ("coot", coot_activitynet, ""), ("coot_tiny", coot_activitynet, "tiny"),
                            ("xml", xml_tvr, ""), ("xml_sub_tiny", xml_tvr, "tiny,sub"),
                            ("mmt", mmt_tvc, ""), ("mmt_video_tiny", mmt_tvc, "tiny,video"),
                            ("smit_language", smit_language_amm, "tiny"),
                            ("smit_spoken_phase2", smit_spoken_amm, "tiny,phase2")):
    config = module.get_config(arg)
    if "path" in config.dataset:
      config.dataset.path = missing
    if name.startswith("mmt"):
      config.model.vocab = str(vocab)
    out[name] = config
  return out


def test_specs_open_no_dataset(tmp_path, monkeypatch):
  monkeypatch.setattr(builders, "get_source", _no_dataset)
  for name, config in _configs(tmp_path).items():
    task = task_registry.build_task(config)
    train = task.example_spec(train=True)
    assert train and all(isinstance(v, jax.ShapeDtypeStruct) for v in train.values()), name
    assert task.batch_spec(8, train=True), name
    spec = task.example_spec(train=False)
    fns = sorted(spec) if task_registry.is_keyed_spec(spec) else [None]
    for fn in fns:
      assert task.batch_spec(8, train=False, predict_fn=fn), (name, fn)
    if task_registry.is_keyed_spec(spec):
      with pytest.raises(ValueError, match="name one of"):
        task.batch_spec(8, train=False)
      with pytest.raises(ValueError, match="no example spec for predict function 'logits'"):
        task.predict_example_spec("logits")
  # The paper's widths, where the config names them.
  configs = _configs(tmp_path)
  avr = task_registry.build_task(configs["avr"]).example_spec(train=False)
  assert avr["rgb"].shape == (4, 32, 224, 224, 3) and avr["audio"].shape == (4, 800, 128)
  xml = task_registry.build_task(configs["xml"]).example_spec(train=False)
  assert xml["encode_context"]["video"].shape == (100, 3072)
  assert xml["encode_query"]["query"].shape == (30, 768)

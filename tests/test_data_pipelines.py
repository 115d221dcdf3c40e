"""Dataset lookup and the AVR input pipeline, on the synthetic world and its TFDS form."""
import pathlib
import sys

import ml_collections
import numpy as np
import pytest

from avtext import errors
from avtext.data import audio
from avtext.data import builders
from avtext.data import pipelines
from avtext.data import video
from avtext.text import tokenizers
from avworld import ClipCaptionSource, WorldSpec

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import videocc_avr  # pylint: disable=g-import-not-at-top,wrong-import-position


def tiny_data():
  return videocc_avr.get_config("tiny").data


def test_paper_config_fails_with_what_to_prepare():
  config = videocc_avr.get_config()
  with pytest.raises(FileNotFoundError) as e:
    builders.get_source(config.dataset, "train")
  message = str(e.value)
  assert "videocc3m" in message and "VideoCC3M" in message
  assert "configs/videocc_avr.py:demo" in message


def test_unknown_dataset_and_variant_errors():
  with pytest.raises(ValueError, match="config.dataset.name='nope'"):
    builders.get_source(ml_collections.ConfigDict({"name": "nope"}), "train")
  with pytest.raises(ValueError, match="unknown variant"):
    videocc_avr.get_config("demo,fast")


def test_paper_defaults():
  c = videocc_avr.get_config()
  assert (c.model.video.n_bottlenecks, c.model.video.fusion_layer) == (4, 8)
  assert (c.data.num_frames, c.data.frame_stride) == (32, 14)
  assert c.data.spec_segments * c.data.spec_segment_frames == 800
  assert c.data.num_mel_bins == 128 and c.data.max_text_len == 32
  assert c.model.embed_dim == 256 and c.loss.temperature == 0.05
  assert (c.optimizer.name, c.optimizer.momentum, c.optimizer.warmup_epochs) == ("sgd", 0.9, 1.5)
  assert (c.train.batch_size, c.train.num_epochs, c.data.eval_num_clips) == (256, 4, 4)


def _examples(source, *, train):
  data = tiny_data()
  return pipelines.ClipExamples(pipelines.ClipReader(source), data,
                                tokenizers.Tokenizer(max_len=data.max_text_len), train=train)


def test_lazy_rendering_equals_full_example_path(tmp_path):
  """The synthetic fast path (render only sampled frames) == slicing full examples.

  The full-example path is the one TFDS-materialized (real) datasets take.
  """
  from avworld import tfds_builder  # pylint: disable=g-import-not-at-top
  builder = tfds_builder.SyntheticClipCaption(config="tiny", data_dir=str(tmp_path))
  builder.download_and_prepare()
  cfg = builder.builder_config
  lazy_source = ClipCaptionSource("test", seed=cfg.seed, num_examples=cfg.split_sizes["test"],
                                  spec=cfg.spec)

  class Decoded:  # the TFDS records decoded back into examples
    def __init__(self, ds):
      self.ds = ds

    def __len__(self):
      return len(self.ds)

    def __getitem__(self, i):
      return tfds_builder.decode_record(self.ds[i])

  full_source = Decoded(builder.as_data_source("test"))
  by_name = builders.get_source(ml_collections.ConfigDict(
      {"name": "tfds:synthetic_clip_caption/tiny", "data_dir": str(tmp_path)}), "test")
  assert by_name.kind == builders.CLIPS and len(by_name) == cfg.split_sizes["test"]
  assert by_name[2]["frames"].tobytes() == lazy_source[2]["frames"].tobytes()
  for train in (False, True):
    lazy, full = _examples(lazy_source, train=train), _examples(full_source, train=train)
    for i in range(len(lazy_source)):
      rng_a, rng_b = np.random.default_rng(i), np.random.default_rng(i)
      a, b = lazy(i, rng_a), full(i, rng_b)
      assert a.keys() == b.keys()
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key} of example {i}")


def test_eval_example_has_k_clips_and_aligned_audio():
  data = tiny_data()
  spec = WorldSpec(height=32, width=32, duration_s=2.0)
  source = ClipCaptionSource("test", num_examples=3, spec=spec)
  ex = _examples(source, train=False)(1)
  k = data.eval_num_clips
  assert ex["rgb"].shape == (k, data.num_frames, data.image_size, data.image_size, 3)
  assert ex["audio"].shape == (k, data.spec_segments * data.spec_segment_frames, data.num_mel_bins)
  # Clip j's frames are test_clip_indices row j, normalized to [-1, 1].
  idx = video.test_clip_indices(spec.num_frames, data.num_frames, data.frame_stride, k)
  frames = source.render_frames(1, idx.ravel()).reshape(idx.shape + (32, 32, 3))
  np.testing.assert_allclose(ex["rgb"], frames.astype(np.float32) / 127.5 - 1.0, atol=1e-6)
  # The first segment of clip 0 is the log-mel of the audio window centred on the clip.
  hop = 160
  span = ((data.spec_segments - 1) * data.spec_segment_stride_frames
          + data.spec_segment_frames) * hop
  centre = int(round((idx[0, 0] + idx[0, -1] + 1) / 2 / spec.fps * spec.sample_rate))
  start = centre - span // 2
  wave = source[1]["audio"]
  seg = np.zeros(data.spec_segment_frames * hop + 240, np.float32)
  lo = max(start, 0)
  seg[lo - start:lo - start + len(wave[lo:start + len(seg)])] = wave[lo:start + len(seg)]
  want = audio.log_mel_spectrogram(seg)[:data.spec_segment_frames]
  np.testing.assert_allclose(ex["audio"][0, :data.spec_segment_frames], want, atol=1e-5)
  tokens = tokenizers.Tokenizer(max_len=data.max_text_len)(source.describe(1)["caption"])
  np.testing.assert_array_equal(ex["input_ids"], tokens["input_ids"])


class _Records:
  """Two synthetic clips read as full records (no lazy rendering), with `extra` fields."""

  def __init__(self, **extra):
    self.inner = ClipCaptionSource("test", num_examples=2,
                                   spec=WorldSpec(height=32, width=32, duration_s=2.0))
    self.extra = extra

  def __len__(self):
    return 2

  def __getitem__(self, i):
    return dict(self.inner[i], **self.extra)


def test_missing_audio_gives_zeros_and_flag_or_a_clear_error():
  silent = _Records(audio=np.zeros(0, np.float32), has_audio=False)
  ex = _examples(silent, train=True)(0, np.random.default_rng(0))
  assert not ex["has_audio"] and not ex["audio"].any()
  data = tiny_data()
  data.allow_missing_audio = False
  strict = pipelines.ClipExamples(pipelines.ClipReader(silent), data,
                                  tokenizers.Tokenizer(max_len=16), train=True)
  with pytest.raises(ValueError, match="example 0: audio track missing.*allow_missing_audio"):
    strict(0, np.random.default_rng(0))


def test_train_batches_are_a_function_of_seed_and_position():
  fn = lambda i, rng: {"i": np.int64(i), "r": rng.integers(1 << 30)}
  a = pipelines.train_batches(10, fn, batch_size=4, seed=3)
  b = pipelines.train_batches(10, fn, batch_size=4, seed=3)
  c = pipelines.train_batches(10, fn, batch_size=4, seed=4)
  np.testing.assert_array_equal(a[7]["r"], b[7]["r"])
  assert not np.array_equal(a[7]["r"], c[7]["r"])
  # Each epoch of 10 examples is a fresh permutation.
  seen = np.concatenate([a[k]["i"] for k in range(5)])  # 20 examples = 2 epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
  assert not np.array_equal(seen[:10], seen[10:])
  # Hosts see disjoint shards.
  h0 = pipelines.train_batches(10, fn, batch_size=5, seed=3, process_index=0, process_count=2)
  h1 = pipelines.train_batches(10, fn, batch_size=5, seed=3, process_index=1, process_count=2)
  assert not set(h0[0]["i"]) & set(h1[0]["i"])
  # A user error (one `error:` line from main), naming the flag to change.
  with pytest.raises(errors.BadInput, match="fewer than one batch.*--config.train.batch_size"):
    pipelines.train_batches(3, fn, batch_size=4, seed=0)


class _Forbidden:
  """Stands in for data a pipeline must not touch: any use fails the test."""

  def __init__(self, what):
    self.what = what

  def __array__(self, *args, **kwargs):
    raise AssertionError(f"{self.what} was read")

  def __getitem__(self, index):
    raise AssertionError(f"{self.what} was indexed")


def _modality_sources():
  """A lazy source and a full-example source whose unused modality must stay untouched."""
  inner = ClipCaptionSource("test", num_examples=2,
                            spec=WorldSpec(height=32, width=32, duration_s=2.0))

  class Lazy:
    def __init__(self, forbid):
      self.forbid = forbid

    def __len__(self):
      return len(inner)

    def describe(self, i):
      return inner.describe(i)

    def render_frames(self, i, idx):
      assert self.forbid != "rgb", "render_frames called for an audio-only model"
      return inner.render_frames(i, idx)

    def render_audio(self, i, start, n):
      assert self.forbid != "audio", "render_audio called for an RGB-only model"
      return inner.render_audio(i, start, n)

  class Full:
    def __init__(self, forbid):
      self.forbid = forbid

    def __len__(self):
      return len(inner)

    def __getitem__(self, i):
      ex = inner[i]
      if self.forbid == "audio":
        ex["audio"] = _Forbidden("the waveform")
      if self.forbid == "rgb":  # its length is all an audio-only model may use
        num_frames = len(ex["frames"])
        ex["frames"] = type("Frames", (_Forbidden,), {"__len__": lambda s: num_frames})(
            "the frames")
      return ex
  return Lazy, Full


@pytest.mark.parametrize("train", [True, False])
def test_modalities_read_only_what_the_model_uses_and_change_nothing_else(train):
  data = tiny_data()
  tok = tokenizers.Tokenizer(max_len=data.max_text_len)
  for source_cls in _modality_sources():
    both = pipelines.ClipExamples(pipelines.ClipReader(source_cls(None)), data, tok, train=train)
    for modality, forbid in (("rgb", "audio"), ("audio", "rgb")):
      only = pipelines.ClipExamples(pipelines.ClipReader(source_cls(forbid)), data, tok,
                                    train=train, modalities=(modality,))
      for i in range(2):
        want = both(i, np.random.default_rng(i))
        got = only(i, np.random.default_rng(i))
        dropped = {"audio", "has_audio"} if modality == "rgb" else {"rgb"}
        assert set(got) == set(want) - dropped
        for key in got:  # same RNG draws in the same order: identical bytes
          assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
          assert got[key].tobytes() == want[key].tobytes(), (source_cls.__name__, modality, key)


def test_modalities_argument_forms():
  data = tiny_data()
  source = ClipCaptionSource("test", num_examples=1,
                             spec=WorldSpec(height=32, width=32, duration_s=2.0))
  reader = pipelines.ClipReader(source)
  assert pipelines.ClipExamples(reader, data, train=False).modalities == ("rgb", "audio")
  assert pipelines.ClipExamples(reader, data, train=False,
                                modalities="rgb+audio").modalities == ("rgb", "audio")
  assert pipelines.ClipExamples(reader, data, train=False, modalities="audio").modalities == (
      "audio",)
  for bad in ((), ("rgb", "rgb"), ("depth",), "rgb+text"):
    with pytest.raises(ValueError, match="modalities must be a non-empty, duplicate-free"):
      pipelines.ClipExamples(reader, data, train=False, modalities=bad)


def test_video_id_is_an_eval_host_field_only():
  captioned = _Records(video_id=b"vid7")  # several captions per video, e.g. a TFDS dataset
  evaluation = _examples(captioned, train=False)(1)
  assert evaluation["video_id"] == "vid7"  # decoded, kept as a str for the host
  training = _examples(captioned, train=True)(1, np.random.default_rng(0))
  assert "video_id" not in training  # training batches hold arrays only
  assert "video_id" not in _examples(captioned.inner, train=False)(1)

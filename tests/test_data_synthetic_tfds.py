"""The TFDS builder materializes exactly what the random-access source gives."""
import json

import numpy as np
import tensorflow_datasets as tfds

from avworld import clips
from avworld import tfds_builder


def test_tiny_build_reads_back_identical_bytes(tmp_path):
  builder = tfds_builder.SyntheticClipCaption(config='tiny',
                                              data_dir=str(tmp_path))
  builder.download_and_prepare()
  config = builder.builder_config
  assert builder.info.file_format.value == 'array_record'
  assert list((tmp_path / 'synthetic_clip_caption').rglob(
      '*test.array_record*'))
  assert config.spec.height == config.spec.width == 32
  assert config.spec.duration_s == 1.0

  for split, size in config.split_sizes.items():
    source = clips.ClipCaptionSource(split, seed=config.seed,
                                     num_examples=size, spec=config.spec)
    records = builder.as_data_source(split)
    assert len(records) == size == 6
    for i in range(size):
      got = tfds_builder.decode_record(records[i])
      want = source[i]
      assert set(got) == set(want)
      for key in ('frames', 'audio'):
        assert got[key].dtype == want[key].dtype
        assert got[key].shape == want[key].shape
        assert got[key].tobytes() == want[key].tobytes(), (split, i, key)
      for key in ('caption', 'clip_id', 'has_audio', 'mentions_sound'):
        assert got[key] == want[key], (split, i, key)
      # JSON keeps floats exactly (shortest repr round-trips).
      assert got['attributes'] == want['attributes']
      assert json.dumps(got['attributes'], sort_keys=True) == json.dumps(
          want['attributes'], sort_keys=True)

  # The registered name reads the same files, as real datasets are read.
  by_name = tfds.data_source('synthetic_clip_caption/tiny', split='test',
                             data_dir=str(tmp_path))
  first = tfds_builder.decode_record(by_name[0])
  want = clips.ClipCaptionSource('test', num_examples=6,
                                 spec=config.spec)[0]
  assert first['clip_id'] == want['clip_id']
  np.testing.assert_array_equal(first['frames'], want['frames'])

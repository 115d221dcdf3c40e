"""Input pipelines: grain datasets of host-local numpy batches per task.

Training data is `MapDataset.range(n) -> seed -> shuffle (a new order each
epoch) -> repeat -> random_map(example) -> batch -> this host's rows`, so
global batch k is a pure function of (seed, k), whatever the number of hosts:
the iterator's state is just its position, saved in every checkpoint, and a
resumed run sees exactly the batches an uninterrupted one would.
"""
import json
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np

from avtext import errors
from avtext.data import audio as audio_lib
from avtext.data import video
from avtext.data import video_io
from avtext.modalities import MODALITIES
from avtext.modalities import parse_modalities
from avtext.text import tokenizers


def train_batches(num_examples: int, example_fn: Callable[[int, np.random.Generator], dict],
                  *, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1,
                  collate: Callable[[Sequence[dict]], dict] | None = None) -> "grain.MapDataset":
  """Infinite, deterministic, shuffled batches of `example_fn(index, rng)`.

  `batch_size` is the per-process size L. All processes walk one global
  stream of examples (one shuffle, one augmentation rng per stream position),
  and global batch k is its positions [k*G, (k+1)*G), G = L * process_count;
  process p yields rows [p*L, (p+1)*L) of it. So the global batches, and a
  checkpointed run, do not depend on how many processes feed them.
  `collate` turns a process's list of examples into its batch (default: stack
  every field); tasks with variable-length examples pack them (COOT).
  """
  global_size = batch_size * process_count
  if num_examples < global_size:
    raise errors.BadInput(f"{num_examples} training examples, fewer than one batch of "
                          f"{global_size} ({process_count} process(es) x {batch_size}); "
                          "lower --config.train.batch_size or give more training data")
  import grain  # pylint: disable=g-import-not-at-top  (with orbax: a quarter second)
  ds = grain.MapDataset.range(num_examples).seed(seed).shuffle().repeat()
  # random_map seeds each example by its stream position, so the rows are
  # picked after it; MapDatasets are lazy, so a process only builds its own.
  chunks = ds.random_map(example_fn).batch(batch_size, drop_remainder=True, batch_fn=collate)
  return chunks[process_index::process_count] if process_count > 1 else chunks


def source_caption(source: Any, index: int) -> str:
  """Caption `index` of a clips source, decoding no frame when the source can describe."""
  if hasattr(source, "describe"):
    return source.describe(index)["caption"]
  caption = source[index]["caption"]
  return caption.decode() if isinstance(caption, bytes) else str(caption)


def source_captions(source: Any, n: int | None = None) -> list[str]:
  """The first n (default all) captions of a clips source."""
  n = len(source) if n is None else min(n, len(source))
  return [source_caption(source, i) for i in range(n)]


class ClipReader:
  """Frames and audio of clip `i`, rendering only what is asked when the source can."""

  def __init__(self, source: Any):
    self.source = source
    self._lazy = hasattr(source, "render_frames") and hasattr(source, "describe")

  def __len__(self) -> int:
    return len(self.source)

  def read(self, index: int, frame_indices_fn, audio_window_fn,
           modalities: Sequence[str] = MODALITIES) -> dict:
    """Example with frames[frame_indices_fn(num_frames)] and the audio window.

    `audio_window_fn(frame_indices, num_samples)` -> [(start, length)] windows.
    Only the `modalities` asked for are read: without 'rgb' no frame is
    rendered or indexed and 'frames' is absent; without 'audio' no audio is
    rendered or sliced and 'audio' / 'has_audio' are absent ('audio' is None
    when the clip has no audio track). Always returned: 'frame_indices' (the
    audio windows are centred on them), 'caption', and what labels exist: the
    synthetic world's ground-truth 'attributes', or a stored 'label' field.

    A file that fails to decode (`video_io.VideoReadError`) is replaced by the entry
    the source's `replacement(index, error)` names (file-backed training splits, see
    `builders.media_clips`), which counts it; without one the error propagates.
    """
    while True:
      try:
        return self._read(index, frame_indices_fn, audio_window_fn, modalities)
      except video_io.VideoReadError as e:
        replace = getattr(self.source, "replacement", None)
        other = replace(index, e) if replace is not None else None
        if other is None:
          raise
        index = other

  def _read(self, index, frame_indices_fn, audio_window_fn, modalities) -> dict:
    if self._lazy:
      desc = self.source.describe(index)
      idx = frame_indices_fn(desc["num_frames"])
      out = {"frame_indices": idx, "caption": desc["caption"],
             "attributes": desc.get("attributes"), "clip_id": desc.get("clip_id")}
      if desc.get("video_id") is not None:  # several captions of one video (one-to-many)
        out["video_id"] = desc["video_id"]
      if "rgb" in modalities:
        frames = self.source.render_frames(index, np.ravel(idx))
        out["frames"] = frames.reshape(np.shape(idx) + frames.shape[1:])
      if "audio" in modalities:
        audio = None
        if desc["has_audio"]:
          total = desc["num_samples"]
          audio = []
          for start, length in audio_window_fn(idx, total):
            lo, hi = max(start, 0), min(start + length, total)
            part = self.source.render_audio(index, lo, hi - lo) if hi > lo else np.zeros(0)
            audio.append(_place(part, lo - start, length))
        out.update(audio=audio, has_audio=desc["has_audio"])
      return out
    ex = self.source[index]
    idx = frame_indices_fn(len(ex["frames"]))
    caption = ex["caption"]
    caption = caption.decode() if isinstance(caption, bytes) else str(caption)
    out = {"frame_indices": idx, "caption": caption, "label": ex.get("label")}
    if ex.get("video_id") is not None:  # several captions of one video (one-to-many)
      vid = ex["video_id"]
      out["video_id"] = vid.decode() if isinstance(vid, bytes) else str(vid)
    if "rgb" in modalities:
      out["frames"] = np.asarray(ex["frames"])[idx]
    if "audio" in modalities:
      has_audio = bool(ex.get("has_audio", True))
      wave = np.asarray(ex["audio"], np.float32) if has_audio else None
      audio = None
      if wave is not None and wave.size:
        audio = [_slice_padded(wave, s, n) for s, n in audio_window_fn(idx, len(wave))]
      out.update(audio=audio, has_audio=audio is not None)
    return out


def _place(part: np.ndarray, offset: int, length: int) -> np.ndarray:
  """`part` at `offset` in zeros of `length` (audio outside the clip is silence)."""
  out = np.zeros(length, np.float32)
  out[offset:offset + len(part)] = part
  return out


def _slice_padded(wave: np.ndarray, start: int, length: int) -> np.ndarray:
  lo, hi = max(start, 0), min(start + length, len(wave))
  return _place(wave[lo:hi] if hi > lo else wave[:0], lo - start, length)


class ClipExamples:
  """Clip -> model inputs: frames and log-mel audio (VideoCC §4.1, §5.2, app. C).

  train: one segment of `num_frames` frames at `frame_stride` with a random
    start; K=1. eval: `eval_num_clips` equally spaced segments; every output
    has a leading K axis. Audio: `spec_segments` log-mel segments of
    `spec_segment_frames` frames, `spec_segment_stride_frames` apart, centred
    on the RGB segment (app. C: 8 x 100 frames, 3 s apart, 800 x 128 over 24 s);
    zeros and has_audio=False when the clip has no audio.
  With a `tokenizer`, its fields of the caption are added ('input_ids' /
  'attention_mask' for retrieval, `CaptionTokenizer`'s for captioning); with a
  `label_fn(clip)`, its 'labels' (classification). `host_fields` (eval only)
  are clip fields passed on as strings, dicts JSON-encoded: 'caption',
  'attributes', 'clip_id' (the record's id, else the example index). At
  eval time a record's 'video_id' (several captions of one video) is passed
  on as a host field (a str) for the retrieval evaluator's ground truth.
  `modalities` ('rgb', 'audio' or both, the default) are the inputs the model
  uses: only those are read and preprocessed, 'rgb' or 'audio' + 'has_audio'
  are absent otherwise. A modality's output does not depend on the other's
  presence: audio draws nothing from `rng`.
  """

  def __init__(self, reader: ClipReader, data: ml_collections.ConfigDict,
               tokenizer: tokenizers.Tokenizer | None = None, *, train: bool,
               label_fn: Callable[[dict], np.ndarray] | None = None,
               modalities: str | Sequence[str] = MODALITIES,
               host_fields: Sequence[str] = ()):
    self.reader = reader
    self.modalities = parse_modalities(modalities)
    self.data = data
    self.tokenizer = tokenizer
    self.label_fn = label_fn
    self.host_fields = tuple(host_fields)
    self.train = train
    self.hop = int(round(data.sample_rate * audio_lib.HOP_MS / 1000))
    self.win = int(round(data.sample_rate * audio_lib.WINDOW_MS / 1000))

  def _frame_indices(self, rng):
    d = self.data

    def fn(num_frames):
      if self.train:
        return video.sample_frame_indices(
            num_frames, d.num_frames, d.frame_stride, rng=rng)[None]
      return video.test_clip_indices(
          num_frames, d.num_frames, d.frame_stride, num_clips=d.eval_num_clips)
    return fn

  def _audio_windows(self, clip_frame_indices, num_samples):
    """One waveform window per (clip, spectrogram segment), centred on each clip."""
    d = self.data
    seg_samples = d.spec_segment_frames * self.hop + self.win - self.hop
    span = ((d.spec_segments - 1) * d.spec_segment_stride_frames
            + d.spec_segment_frames) * self.hop
    windows = []
    for clip in np.atleast_2d(clip_frame_indices):
      centre = int(round((clip[0] + clip[-1] + 1) / 2 / d.fps * d.sample_rate))
      start = centre - span // 2
      for s in range(d.spec_segments):
        windows.append((start + s * d.spec_segment_stride_frames * self.hop, seg_samples))
    return windows

  def _log_mel(self, index: int, windows: list[np.ndarray] | None, k: int) -> np.ndarray:
    """float32 [K, spec_segments * spec_segment_frames, mel] of the audio windows."""
    d = self.data
    spec_shape = (d.spec_segments * d.spec_segment_frames, d.num_mel_bins)
    if windows is None:
      if not d.allow_missing_audio:
        raise ValueError(f"example {index}: audio track missing; set "
                         "data.allow_missing_audio=True to feed zeros (VideoCC app. C)")
      return np.zeros((k,) + spec_shape, np.float32)
    segs = [audio_lib.log_mel_spectrogram(
        w, sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins)[:d.spec_segment_frames]
            for w in windows]
    return np.stack(segs).reshape((k,) + spec_shape).astype(np.float32)

  def __call__(self, index: int, rng: np.random.Generator | None = None) -> dict:
    d = self.data
    clip = self.reader.read(index, self._frame_indices(rng), self._audio_windows,
                            self.modalities)
    k = np.shape(clip["frame_indices"])[0]
    out = {}
    if "rgb" in self.modalities:
      crop = {"area_range": tuple(d.crop_area_range),
              "aspect_ratio_range": tuple(d.crop_aspect_ratio_range)}
      rgb = np.stack([
          video.resize_crop_normalize(f, size=d.image_size, train=self.train, rng=rng,
                                      **crop)
          for f in clip["frames"]])
      out["rgb"] = rgb.astype(np.float32)
    if "audio" in self.modalities:
      out["audio"] = self._log_mel(index, clip["audio"], k)
      out["has_audio"] = np.full((k,), clip["has_audio"])
    if self.tokenizer is not None:
      tokens = self.tokenizer([clip["caption"]])
      out.update({key: value[0] for key, value in tokens.items()})
    if self.label_fn is not None:
      out["labels"] = self.label_fn(clip)
    if self.train:  # K = 1 at training time
      out = {key: (v[0] if key in ("rgb", "audio", "has_audio") else v) for key, v in out.items()}
    else:
      if clip.get("video_id") is not None:
        # A host field: the retrieval evaluator groups captions of one video by it.
        out["video_id"] = clip["video_id"]
      for name in self.host_fields:
        value = clip.get(name)
        if name == "clip_id" and value is None:
          value = clip.get("video_id") or f"{index:08d}"
        out[name] = json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)
    return out

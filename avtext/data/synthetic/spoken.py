"""Spoken-caption variant of the synthetic world, standing in for Spoken Moments (S-MiT).

Each example is a clip of the clip-caption variant (`clips.ClipCaptionSource`,
3 s long by default, as S-MiT's Moments in Time videos are) with, from its own
random stream ('smit/<split>', so the clip itself is unchanged):

  'transcript'      the caption as an ASR engine would return it: seeded word
                    substitutions and deletions at word error rate `wer`
                    (`speech.asr_transcript`; default 15 %)
  'speaker'         {'pitch', 'tempo', 'noise', 'seed'} (`speech.sample_speaker`)
  'spoken_caption'  float32 16 kHz audio of the caption (not of the transcript:
                    the ASR errors are the engine's, the speech is what was said),
                    rendered by `speech.render_speech`; `render_speech(i)` alone
                    skips the frames

The language-caption model reads 'transcript', the spoken-caption model
'spoken_caption'; the retrieval oracle (`num_fitting_clips`) is the clip
variant's, on the clean caption.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from avtext.data.synthetic import captions
from avtext.data.synthetic import clips
from avtext.data.synthetic import speech
from avtext.data.synthetic import world

SPLIT_SIZES = {'train': 20_000, 'val': 1000, 'test': 2000}  # test: five 1k subsets differ
CLIP_SECONDS = 3.0


class SpokenClipSource(clips.ClipCaptionSource):
  """Clips with a caption, its ASR transcript and its spoken rendering (module doc)."""

  def __init__(self, split: str, *, seed: int = 0, num_examples: int | None = None,
               spec: world.WorldSpec = world.WorldSpec(duration_s=CLIP_SECONDS),
               wer: float = 0.15, substitution_share: float = 0.7):
    super().__init__(split, seed=seed, spec=spec, num_examples=SPLIT_SIZES.get(split)
                     if num_examples is None else num_examples)
    if not 0.0 <= wer <= 1.0 or not 0.0 <= substitution_share <= 1.0:
      raise ValueError(f'SpokenClipSource: wer and substitution_share must be in [0, 1], '
                       f'got {wer}, {substitution_share}')
    self.wer, self.substitution_share = wer, substitution_share
    self._vocabulary = captions.caption_vocabulary()

  def __repr__(self) -> str:
    return (f'SpokenClipSource(split={self.split!r}, seed={self.seed}, '
            f'num_examples={self.num_examples}, wer={self.wer}, spec={self.spec})')

  def _speech(self, index: int) -> tuple[speech.Speaker, str]:
    caption = self._sample(index)[2]
    rng = world.example_rng(self.seed, f'smit/{self.split}', self._index(index)).text
    speaker = speech.sample_speaker(rng)
    transcript = speech.asr_transcript(rng, caption, self._vocabulary, wer=self.wer,
                                       substitution_share=self.substitution_share)
    return speaker, transcript

  def describe(self, index: int) -> dict[str, Any]:
    out = super().describe(index)
    speaker, transcript = self._speech(index)
    out.update(transcript=transcript, speaker=dataclasses.asdict(speaker))
    return out

  def render_speech(self, index: int) -> np.ndarray:
    """float32 16 kHz samples of clip `index`'s spoken caption."""
    return speech.render_speech(self._sample(index)[2], self._speech(index)[0])

  def __getitem__(self, index: int) -> dict[str, Any]:
    example = super().__getitem__(index)
    speaker, transcript = self._speech(index)
    example.update(transcript=transcript, speaker=dataclasses.asdict(speaker),
                   spoken_caption=speech.render_speech(example['caption'], speaker))
    return example

"""Spoken-caption clips of the synthetic world, standing in for Spoken Moments (S-MiT).

Each example is a clip of the clip-caption variant (`clips.ClipCaptionSource`,
3 s long by default, as S-MiT's Moments in Time videos are) with, from its own
random stream ('smit/<split>', so the clip itself is unchanged):

  'transcript'      the caption as an ASR engine would return it: seeded word
                    substitutions and deletions at word error rate `wer`
                    (`tone_speech.asr_transcript`; default 15 %)
  'speaker'         the speaker's fields: with speech='tones' (the default)
                    {'pitch', 'tempo', 'noise', 'seed'} (`tone_speech.sample_speaker`);
                    with speech='espeak' an espeak voice, pitch, rate and room
                    (`tts.sample_voice`, from its own stream 'smit_voice/<split>')
  'spoken_caption'  float32 16 kHz audio of the caption (not of the transcript:
                    the ASR errors are the engine's, the speech is what was said),
                    rendered by `tone_speech.render_speech` (tones: a fixed sound per
                    word) or `tts.render_speech` (espeak: real speech);
                    `render_speech(i)` alone skips the frames

With `transcripts` (one per example, in order: a real engine's output on these
spoken captions, `avworld.tools.smit_asr`), 'transcript' is that engine's instead of
the seeded word errors.

The language-caption model reads 'transcript', the spoken-caption model
'spoken_caption'; the retrieval oracle (`num_fitting_clips`) is the clip
variant's, on the clean caption.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Sequence

import numpy as np

from avworld import captions
from avworld import clips
from avworld import tone_speech
from avworld import tts
from avworld import world

SPLIT_SIZES = {'train': 20_000, 'val': 1000, 'test': 2000}  # test: five 1k subsets differ
CLIP_SECONDS = 3.0
SPEECH = ('tones', 'espeak')


class SpokenClipSource(clips.ClipCaptionSource):
  """Clips with a caption, its ASR transcript and its spoken rendering (module doc)."""

  def __init__(self, split: str, *, seed: int = 0, num_examples: int | None = None,
               spec: world.WorldSpec = world.WorldSpec(duration_s=CLIP_SECONDS),
               wer: float = 0.15, substitution_share: float = 0.7, speech: str = 'tones',
               transcripts: Sequence[str] | None = None):
    super().__init__(split, seed=seed, spec=spec, num_examples=SPLIT_SIZES.get(split)
                     if num_examples is None else num_examples)
    if not 0.0 <= wer <= 1.0 or not 0.0 <= substitution_share <= 1.0:
      raise ValueError(f'SpokenClipSource: wer and substitution_share must be in [0, 1], '
                       f'got {wer}, {substitution_share}')
    if speech not in SPEECH:
      raise ValueError(f'dataset.speech={speech!r}: expected one of {SPEECH} (tones: a '
                       f'fixed sound per word; espeak: real speech)')
    if transcripts is not None and len(transcripts) != self.num_examples:
      raise ValueError(f'SpokenClipSource({split}): {len(transcripts)} ASR transcripts for '
                       f'{self.num_examples} clips; transcribe this split with the same '
                       f'sizes (avworld.tools.smit_asr)')
    self.wer, self.substitution_share = wer, substitution_share
    self.speech, self.transcripts = speech, transcripts
    self._waves: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._vocabulary = captions.caption_vocabulary()

  def __repr__(self) -> str:
    return (f'SpokenClipSource(split={self.split!r}, seed={self.seed}, '
            f'num_examples={self.num_examples}, wer={self.wer}, speech={self.speech!r}, '
            f'spec={self.spec})')

  def _speech(self, index: int) -> tuple[tone_speech.Speaker | tts.Voice, str]:
    caption = self._sample(index)[2]
    i = self._index(index)
    rng = world.example_rng(self.seed, f'smit/{self.split}', i).text
    speaker = tone_speech.sample_speaker(rng)
    transcript = tone_speech.asr_transcript(rng, caption, self._vocabulary, wer=self.wer,
                                            substitution_share=self.substitution_share)
    if self.transcripts is not None:
      transcript = self.transcripts[index]
    if self.speech == 'espeak':  # its own stream: the tone speaker and transcript stay
      speaker = tts.sample_voice(world.example_rng(self.seed, f'smit_voice/{self.split}', i).text)
    return speaker, transcript

  def _render(self, caption: str, speaker) -> np.ndarray:
    return (tts.render_speech if self.speech == 'espeak' else tone_speech.render_speech)(
        caption, speaker)

  def describe(self, index: int) -> dict[str, Any]:
    out = super().describe(index)
    speaker, transcript = self._speech(index)
    out.update(transcript=transcript, speaker=dataclasses.asdict(speaker))
    return out

  def render_speech(self, index: int) -> np.ndarray:
    """float32 16 kHz samples of clip `index`'s spoken caption (the last 256 kept: a
    feature writer reads a batch's speech twice, for its examples and its log-mels)."""
    i = self._index(index)
    with self._lock:
      wave = self._waves.pop(i, None)
    if wave is None:
      wave = self._render(self._sample(i)[2], self._speech(i)[0])
    with self._lock:
      self._waves[i] = wave
      while len(self._waves) > 256:
        self._waves.popitem(last=False)
    return wave.copy()  # a caller may write into its array

  def __getitem__(self, index: int) -> dict[str, Any]:
    example = super().__getitem__(index)
    speaker, transcript = self._speech(index)
    example.update(transcript=transcript, speaker=dataclasses.asdict(speaker),
                   spoken_caption=self.render_speech(index))
    return example

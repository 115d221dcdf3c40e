"""Real speech for the synthetic S-MiT: captions spoken by libespeak-ng.

`render_speech(caption, voice)` has the interface of the tone renderer
(`tone_speech.render_speech(caption, speaker)`): float32 16 kHz samples in [-1, 1]. The
synthesizer is libespeak-ng with its voice data as the `espeakng-loader` wheel ships
them (pinned in requirements.lock; no system package, nothing downloaded). Unlike the
tone renderer, words share phonemes, coarticulate and vary in length with their
neighbours, as the speech S-MiT's encoders were built for does.

A `Voice` is one speaker: an espeak language voice and variant (`en-us+f3`), its pitch
and rate, and the room: a seeded decaying-noise impulse response (reverberation time
`reverb_s`) and white noise at `snr_db`. 22.05 kHz synthesis is resampled to 16 kHz
(polyphase, 320/441).

Determinism. espeak keeps synthesis state across utterances in static variables
(phase, flutter and noise generators) that neither `espeak_Terminate` nor
`espeak_ng_SetRandSeed` resets: the same text rendered twice in one process differs
after the first time. Loading a voice changes later utterances too (after some dozens of
voice changes in one process, a caption may come out shorter or different). So one
helper process per Python process initializes the library, loads the plain 'en' voice
once and never speaks nor loads another; each utterance is spoken by a fork of it, which
loads its own voice, from that same state every time, with the random seed fixed. The
same (caption, voice) gives the same samples bit for bit, in any process and any order,
after any utterances (tests/test_data_synthetic_tts.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
import threading

import numpy as np
from scipy import signal

SAMPLE_RATE = 16_000
ESPEAK_RATE = 22_050  # espeak-ng's output rate
# English voices whose speech the pocketsphinx US-English acoustic model follows.
LANGUAGES = ("en-us", "en-us-nyc", "en", "en-gb-x-rp")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5")


@dataclasses.dataclass(frozen=True)
class Voice:
  """One speaker of the real-speech renderer (module docstring)."""
  language: str = "en-us"  # an espeak-ng voice name
  variant: str = ""  # an espeak-ng variant (voices/!v), '' for the plain voice
  pitch: int = 50  # espeak's 0-99 (50: the voice's own)
  rate: int = 175  # words per minute, 80-450
  reverb_s: float = 0.0  # the room's reverberation time (60 dB decay), 0 for none
  snr_db: float | None = None  # white room noise, dB below the speech; None for none
  seed: int = 0  # the room's impulse response and noise

  def __post_init__(self):
    if not (0 <= self.pitch <= 99 and 80 <= self.rate <= 450 and 0.0 <= self.reverb_s <= 2.0):
      raise ValueError(f"Voice: expected pitch in [0, 99], rate in [80, 450] and reverb_s in "
                       f"[0, 2], got {self}")
    if not self.language or any(c in self.language + self.variant for c in "+ \n"):
      raise ValueError(f"Voice: language {self.language!r} / variant {self.variant!r}: "
                       f"expected espeak names like 'en-us' and 'f3'")

  @property
  def espeak_name(self) -> str:
    return f"{self.language}+{self.variant}" if self.variant else self.language


def sample_voice(rng: np.random.Generator) -> Voice:
  """A speaker of the real-speech corpus: one of 4 English voices x 12 variants, pitch
  35-65, 150-200 words/min, a small room (reverberation 0-0.25 s) and noise at 20-40 dB."""
  return Voice(language=LANGUAGES[int(rng.integers(len(LANGUAGES)))],
               variant=VARIANTS[int(rng.integers(len(VARIANTS)))],
               pitch=int(rng.integers(35, 66)), rate=int(rng.integers(150, 201)),
               reverb_s=float(rng.uniform(0.0, 0.25)), snr_db=float(rng.uniform(20.0, 40.0)),
               seed=int(rng.integers(2**31)))


# ----------------------------------------------------------------------------
# The synthesizer process (module docstring: why a fork per utterance)
# ----------------------------------------------------------------------------

_SERVER = r"""
import ctypes, json, os, struct, sys
import espeakng_loader
lib = ctypes.CDLL(espeakng_loader.get_library_path())
rate = lib.espeak_Initialize(2, 0, espeakng_loader.get_data_path().encode(), 0)  # SYNCHRONOUS
if rate <= 0:
  sys.exit(f"espeak_Initialize failed ({rate})")
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                            ctypes.c_void_p)
out = sys.stdout.buffer
lib.espeak_SetVoiceByName(b"en")  # the English dictionary, loaded once; never changed here
for line in sys.stdin:
  request = json.loads(line)
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child loads its voice and speaks from the parent's state, then exits
    os.close(read)
    pipe = os.fdopen(write, "wb")
    def callback(wav, n, events):
      if n > 0:
        pipe.write(ctypes.string_at(wav, 2 * n))
      return 0
    keep = CALLBACK(callback)
    lib.espeak_SetSynthCallback(keep)
    status = 0 if lib.espeak_SetVoiceByName(request["voice"].encode()) == 0 else 2
    if status == 0:
      lib.espeak_ng_SetRandSeed(ctypes.c_long(0))
      lib.espeak_SetParameter(1, request["rate"], 0)  # espeakRATE
      lib.espeak_SetParameter(3, request["pitch"], 0)  # espeakPITCH
      text = request["text"].encode()
      status = lib.espeak_Synth(text, ctypes.c_size_t(len(text) + 1), 0, 1, 0, 1, None, None)
      lib.espeak_Synchronize()
    pipe.close()
    os._exit(0 if status == 0 else 3)
  os.close(write)
  with os.fdopen(read, "rb") as pipe:
    data = pipe.read()
  _, code = os.waitpid(pid, 0)
  if code:
    data = b""
  out.write(struct.pack("<iq", os.waitstatus_to_exitcode(code), len(data)))
  out.write(data)
  out.flush()
"""


class _Synthesizer:
  """The helper process of this Python process (started on first use)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None
    self._pid = None

  def _process(self) -> subprocess.Popen:
    if self._proc is None or self._pid != os.getpid() or self._proc.poll() is not None:
      try:
        import espeakng_loader  # pylint: disable=g-import-not-at-top,unused-import
      except ImportError as e:
        raise ImportError("real speech needs espeakng-loader==0.2.4 (requirements.lock; "
                          "`make venv` installs it); or set dataset.speech='tones'") from e
      self._proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
      self._pid = os.getpid()
    return self._proc

  def speak(self, text: str, voice: Voice) -> np.ndarray:
    """int16 22.05 kHz samples of `text` in `voice`."""
    request = json.dumps({"text": text, "voice": voice.espeak_name, "rate": voice.rate,
                          "pitch": voice.pitch}) + "\n"
    with self._lock:
      proc = self._process()
      proc.stdin.write(request.encode())
      proc.stdin.flush()
      head = proc.stdout.read(12)
      if len(head) < 12:
        raise RuntimeError("render_speech: the espeak-ng helper process died")
      code, size = struct.unpack("<iq", head)
      data = proc.stdout.read(size)
    if code:
      raise ValueError(f"render_speech: espeak-ng failed on voice {voice.espeak_name!r} "
                       f"(exit {code}); expected a voice of espeak-ng-data/voices or lang, "
                       f"e.g. 'en-us+f3'")
    return np.frombuffer(data, np.int16)


_SYNTHESIZER = _Synthesizer()


def _room(audio: np.ndarray, voice: Voice) -> np.ndarray:
  rng = np.random.default_rng(voice.seed)
  n = int(voice.reverb_s * SAMPLE_RATE)  # 0 below one sample (sample_voice draws from 0)
  if n > 0:
    t = np.arange(n) / SAMPLE_RATE
    tail = rng.standard_normal(n) * 10.0 ** (-3.0 * t / voice.reverb_s)  # -60 dB at reverb_s
    tail[0] = 0.0
    impulse = np.concatenate([[1.0], 0.3 * tail[1:] / np.sqrt(np.sum(tail ** 2) + 1e-12)])
    audio = signal.fftconvolve(audio, impulse)[:len(audio) + n // 4]
  if voice.snr_db is not None:
    power = np.mean(audio ** 2)
    audio = audio + np.sqrt(power * 10.0 ** (-voice.snr_db / 10.0)) * rng.standard_normal(
        audio.shape)
  return audio


def render_speech(caption: str, voice: Voice = Voice()) -> np.ndarray:
  """float32 16 kHz samples in [-1, 1] of the caption spoken in `voice`."""
  if not any(c.isalnum() for c in caption):
    raise ValueError(f"render_speech: caption {caption!r} has no words")
  raw = _SYNTHESIZER.speak(" ".join(caption.split()), voice).astype(np.float64) / 32768.0
  if not raw.size:
    raise ValueError(f"render_speech: espeak-ng said nothing for {caption!r}")
  audio = _room(signal.resample_poly(raw, 320, 441), voice)  # 22.05 -> 16 kHz
  return np.clip(audio, -1.0, 1.0).astype(np.float32)

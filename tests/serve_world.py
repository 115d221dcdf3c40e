"""What the tests of `avtext.serve` (and the screenshots in docs/) serve: a synthetic index
whose top hits are known, two tiny runs, and the bad inputs of the page.

The runs: configs/videocc_avr.py:tiny (3 steps and its test evaluator: a loss curve
and results.json for the run page) and videocc_caption.py:tiny (RGB only, one step, as
tests/test_index.py trains it), on one device (~40 s together). The videos:
`VIDEOS` mp4s of 4 s at 25 fps, a coloured square moving over a plain background, and
one more that is deleted once indexed. The index is first built by `avtext.index.build`
(the run's real embeddings), then written again by `avtext.index.write` with
synthetic clip vectors: video j's clip `BEST_CLIP` holds K x u_j and its other clips
zeros, so its vector (the mean) is u_j, where e_i . u_j = [i == j] for the text
embeddings e_i of `QUERIES`: query j's top hit is video j, with score 1 and the others
0, and its best clip is `BEST_CLIP` (the K clips of a 4 s video start at 0, 0.92, 1.84
and 2.76 s). The deleted video scores 0.5 for QUERIES[0], second.
A second index is the same files claimed by the captioning run: an index of another
model.
"""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np

QUERIES = ("a red square sliding right", "a green square falling down",
           "a blue square in the corner", "a yellow square going round")
COLOURS = ((220, 40, 40), (40, 180, 60), (50, 80, 220), (230, 210, 40))
BACKGROUNDS = ((30, 30, 30), (230, 230, 230), (90, 60, 40), (20, 60, 90))
BEST_CLIP = 2
SECONDS, FPS, SIZE = 4.0, 25, (120, 160)


def video_name(j: int) -> str:
  return f"clip{j}.mp4" if j % 2 == 0 else f"more/clip{j}.mp4"


def write_videos(folder: pathlib.Path) -> list[str]:
  """The mp4s of QUERIES (+ gone.mp4), relative names."""
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  h, w = SIZE
  names = []
  for j, (colour, background) in enumerate(zip(COLOURS + ((255, 255, 255),),
                                               BACKGROUNDS + ((0, 0, 0),))):
    frames = np.empty((int(SECONDS * FPS), h, w, 3), np.uint8)
    frames[:] = background
    for t in range(len(frames)):
      x = int((w - 40) * t / len(frames)) if j % 2 == 0 else (w - 40) // 2
      y = (h - 40) // 2 if j % 2 == 0 else int((h - 40) * t / len(frames))
      frames[t, y:y + 40, x:x + 40] = colour
    name = video_name(j) if j < len(QUERIES) else "gone.mp4"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    video_io.write_video(folder / name, frames, FPS, faststart=True)
    names.append(name)
  return names


def train_runs(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """(the AVR run, the captioning run), one step each."""
  from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  from tests import test_index  # pylint: disable=g-import-not-at-top
  from tests.test_train_trainer import make_trainer  # pylint: disable=g-import-not-at-top
  config = videocc_avr.get_config("tiny")
  config.num_devices = 1
  config.dataset.num_train, config.dataset.num_eval = 8, 8
  config.train.num_steps = config.train.checkpoint_every_steps = 3
  config.train.log_every_steps = 1
  make_trainer(config, root / "avr").train()  # + its test evaluator: results.json
  test_index._train_captioner(root / "caption")  # pylint: disable=protected-access
  return root / "avr", root / "caption"


def synthetic_index(out: pathlib.Path, names: list[str], embedder) -> None:
  """Rewrites the built index `out` with the clip vectors of the module docstring."""
  from avtext import index as index_lib  # pylint: disable=g-import-not-at-top
  built = index_lib.VideoIndex(out)
  texts = embedder.embed_texts(list(QUERIES)).astype(np.float64)  # [Q, D]
  # The untrained run's text embeddings lie close together: vectors u_j with
  # e_i . u_j = [i == j] keep the known top hit by a margin of 1.
  vectors = np.linalg.pinv(texts).T  # [Q, D]
  k = built.meta["num_clips"]
  clips = np.zeros((len(names), k, texts.shape[1]), np.float32)
  for j, name in enumerate(names):
    # the deleted video: second for QUERIES[0], at half the score
    clips[j, BEST_CLIP] = k * (vectors[j] if j < len(QUERIES) else vectors[0] / 2)
  stamps = [built.stamps[built.ids.index(n)] for n in names]
  index_lib.write(out, names, clips, stamps, built.meta)


def build(root: pathlib.Path) -> dict:
  """{avr, caption (the runs), videos, index, other (an index of the captioning run),
  moment_videos (clip1.mp4, and clip5.mkv: a container shown as frames), embedder, notes
  (a text file), big (an mp4 of 100 kB)} under root."""
  from avtext import index as index_lib  # pylint: disable=g-import-not-at-top
  avr, caption = train_runs(root)
  videos = root / "videos"
  names = write_videos(videos)
  embedder = index_lib.VideoEmbedder(avr)
  index = root / "my_videos.index"
  index_lib.build(avr, videos, index, embedder=embedder, progress=False)
  synthetic_index(index, names, embedder)
  (videos / "gone.mp4").unlink()
  other = root / "other.index"
  shutil.copytree(index, other)
  meta = json.loads((other / "meta.json").read_text())
  meta["run"] = {"workdir": str(caption), "step": 1,  # the captioning run's one step
                 "config_sha256": index_lib.config_hash(caption)}
  (other / "meta.json").write_text(json.dumps(meta))
  moment_videos = root / "moment_videos"
  moment_videos.mkdir()
  shutil.copy(videos / "more" / "clip1.mp4", moment_videos / "clip1.mp4")
  remux(videos / "clip2.mp4", moment_videos / "clip5.mkv")
  (root / "notes.mp4").write_text("not a video\n" * 10)
  (root / "big.mp4").write_bytes(b"\0" * 100_000)
  return dict(avr=avr, caption=caption, videos=videos, index=index, other=other,
              moment_videos=moment_videos,
              embedder=embedder, notes=root / "notes.mp4", big=root / "big.mp4")


def remux(src: pathlib.Path, dst: pathlib.Path) -> None:
  """src's video stream, packet for packet, in the container dst's suffix names (.mkv):
  a file the page shows as frames."""
  import av  # pylint: disable=g-import-not-at-top
  with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
    stream = out.add_stream_from_template(inp.streams.video[0])
    for packet in inp.demux(inp.streams.video[0]):
      if packet.dts is not None:
        packet.stream = stream
        out.mux(packet)


class Moments:
  """A stand-in for `search_moments.Searcher` over a corpus of the world's videos by
  stem (`MOMENT_VIDEOS`, 4 clips of 1 s each): every query finds MOMENTS, best first."""
  FOUND = (("clip1", 1.0, 2.0, 0.9), ("clip5", 2.0, 3.0, 0.5), ("absent", 0.0, 1.0, 0.1))

  def __init__(self):
    import types  # pylint: disable=g-import-not-at-top
    self.store = types.SimpleNamespace(videos=["clip1", "clip5", "absent"],
                                       mask=np.ones((3, 4), np.uint8), clip_length=1.0)

  def __call__(self, texts, top=10):
    return [list(self.FOUND[:top]) for _ in texts]

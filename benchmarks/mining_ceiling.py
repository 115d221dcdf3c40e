r"""The precision ceiling of an image-only f on the synthetic mining world (issue 32).

    make demo-mining        # writes workdirs/demo/mining/world first
    python benchmarks/mining_ceiling.py [--world=workdirs/demo/mining/world]

A seed is an image; its caption may state the objects' motion, which no still shows
(`avtext.data.synthetic.mining`). An ideal image embedder sees everything an image
shows: each object's shape and colour, the background, the number of objects. Here that
is an oracle f read from the world's truth, not from pixels: the one-hot counts of
(shape, colour) per object, background and count, L2-normalized, so a seed and a frame
have cosine 1 exactly when the frame shows what the seed image shows. No f computed from
images can tell those frames apart by what the images show, so the precision of the
oracle's strictest matches is the ceiling of any image f's precision. Prints markdown:
  1. of the (seed, corpus scene) pairs whose scene shows exactly the seed image's
     visible attributes, the share whose scene fits the caption, by whether the caption
     states a motion;
  2. the pipeline's statistics for the oracle f (its search, `search.search_shard`: top 10
     videos per seed, best frame each; its 10 s clips and precision, `outputs`) per τ,
     over the corpus' readable videos at 1 fps.
"""
import argparse
import json
import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from avtext.data import video_io  # pylint: disable=wrong-import-position
from avtext.data.synthetic import captions  # pylint: disable=wrong-import-position
from avtext.data.synthetic import mining_corpus  # pylint: disable=wrong-import-position
from avtext.data.synthetic import world  # pylint: disable=wrong-import-position
from avtext.mining import embed  # pylint: disable=wrong-import-position
from avtext.mining import files  # pylint: disable=wrong-import-position
from avtext.mining import outputs  # pylint: disable=wrong-import-position
from avtext.mining import pipeline  # pylint: disable=wrong-import-position
from avtext.mining import search  # pylint: disable=wrong-import-position

PAIRS = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]


def visible(attrs) -> np.ndarray:
  """What a still shows: objects' (shape, colour) counts, background, count (one-hot)."""
  v = np.zeros(len(PAIRS) + len(world.BACKGROUNDS) + world.MAX_OBJECTS + 1)
  for o in attrs['objects']:
    v[PAIRS.index((o['shape'], o['colour']))] += 1
  v[len(PAIRS) + world.BACKGROUNDS.index(attrs['background'])] = 1
  v[len(PAIRS) + len(world.BACKGROUNDS) + attrs['num_objects']] = 1
  return v


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--world", default="workdirs/demo/mining/world")
  p.add_argument("--taus", default="0.6,0.8,0.9,0.99")
  a = p.parse_args()
  videos_dir = pathlib.Path(a.world) / "videos"
  meta = json.loads((videos_dir / "world.json").read_text())
  w = mining_corpus.world_from_meta(meta)
  seeds = files.read_seeds(pathlib.Path(a.world) / "seeds" / "seeds.tsv")
  rows = [meta["seeds"][sid] for sid, _, _ in seeds]
  seed_attrs = [w._seed(i)[0].attributes() for i in rows]  # pylint: disable=protected-access
  mentions = [w.seed_mention(i) for i in rows]
  cfg = pipeline.MiningConfig(tau_grid=tuple(float(t) for t in a.taus.split(",")))

  # The readable videos of >= t seconds, frames at 1 fps (as the pipeline decodes them).
  records, scene_attrs = [], []
  for vid, path in files.list_videos(videos_dir):
    try:
      info = video_io.probe(path)
      if info.duration_s < cfg.clip_seconds:
        continue
      times = video_io.sample_times(info.duration_s, cfg.frames_hz)
      video_io.read_frames(path, times[-1:])
    except video_io.VideoReadError:
      continue
    video = w.video(meta["videos"][vid])
    scenes = video.scene_at(times)
    records.append((vid, path, info, times, scenes))
    scene_attrs.append([s.attributes() for s in video.scenes])

  # 1. Scenes showing exactly what the seed image shows: how many fit the caption.
  same = fits = 0
  by_motion = {True: [0, 0], False: [0, 0]}
  for sa, m in zip(seed_attrs, mentions):
    states_motion = any("motion" in d for d in m.get("objects", ()))
    for attrs in (x for per_video in scene_attrs for x in per_video):
      if np.array_equal(visible(sa), visible(attrs)):
        ok = captions.caption_fits(m, attrs)
        same, fits = same + 1, fits + ok
        by_motion[states_motion][0] += 1
        by_motion[states_motion][1] += ok
  stated = sum(any("motion" in d for d in m.get("objects", ())) for m in mentions)
  print(f"{len(seeds)} seeds ({100 * stated / len(seeds):.1f} % of captions state a motion), "
        f"{sum(len(x) for x in scene_attrs)} scenes in {len(records)} readable videos")
  print("\n| (seed, scene) pairs showing what the seed image shows | pairs | fit the caption (%) |"
        "\n|---|---|---|")
  print(f"| all | {same} | {100 * fits / same:.1f} |")
  for k, label in ((False, "caption states no motion"), (True, "caption states a motion")):
    n, f = by_motion[k]
    print(f"| {label} | {n} | {100 * f / n if n else float('nan'):.1f} |")

  # 2. The pipeline's search, clips and precision with the oracle f.
  seed_vecs = embed.l2_normalize(np.stack([visible(x) for x in seed_attrs]))
  frames = embed.l2_normalize(np.concatenate(
      [np.stack([visible(scene_attrs[k][j]) for j in r[4]]) for k, r in enumerate(records)]))
  frame_video = np.concatenate([np.full(len(r[3]), k) for k, r in enumerate(records)])
  times = np.concatenate([r[3] for r in records])
  found, _ = search.search_shard(seed_vecs, frames, frame_video, tau=cfg.search_tau,
                                 top_k=cfg.top_k)
  matches = [[sid, (m.sim, records[m.video][0], float(times[m.frame]),
                    records[m.video][2].duration_s, True, records[m.video][1])]
             for (sid, _, _), ms in zip(seeds, found) for m in ms]
  clip_rows = outputs._clip_rows(matches, {s: c for s, _, c in seeds}, cfg)  # pylint: disable=protected-access
  truth, _ = outputs.synthetic_truth(videos_dir)
  print("\n| f | τ | matches | clips | captions | precision (%) |\n|---|---|---|---|---|---|")
  for tau in sorted(set(cfg.tau_grid)):
    st = outputs.stats_at(clip_rows, tau, cfg.top_k, truth)
    prec = st["precision"]
    print(f"| oracle: visible attributes | {tau} | {st['matches']} | {st['clips']} | "
          f"{st['captions']} | {'-' if prec is None else f'{100 * prec:.1f}'} |")


if __name__ == "__main__":
  main()

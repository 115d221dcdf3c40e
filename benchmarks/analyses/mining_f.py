r"""Which f, which τ: cosines of true and unrelated pairs and precision vs τ for candidate
image embedders on the synthetic mining world, and the ceiling of any image-only f
(issue 32).

    make demo-mining        # writes workdirs/demo/mining/world first
    python -m benchmarks.analyses.mining_f [--world=workdirs/demo/mining/world] \
        [--tower=workdirs/demo/video_pretrain] [--taus=0.6,0.8,0.9]

Candidates, all from the demo's RGB tower on stills (`avtext.mining.embed.tower`):
  raw           f as the pipeline's default uses it (unit rows; the paper's cosine);
  seed_mean     minus the mean seed vector, renormalized (`--center=seed_mean`);
  frame_mean    minus the mean corpus frame vector, renormalized;
  whitened      seed_mean, then ZCA-whitened by the frames' covariance (eigenvalues
                floored at 0.1 x the largest);
  head logits   the stage-1 head's attribute logits (sound excluded);
  head probs    its softmax per attribute group (sound excluded);
  oracle        what a still shows, read from the world's truth, not from pixels: one-hot
                counts of (shape, colour) per object, background and count. A seed and a
                frame have cosine 1 exactly when the frame shows what the seed image
                shows, so no f computed from images ranks frames better by what the images
                show: the precision of its cosine-1 matches is the ceiling of any image f.
Pairs: a seed and a frame of a readable corpus video at 1 fps; *planted*: the frame's
scene was drawn from that seed; *fitting*: its scene fits the seed's caption
(`captions.caption_fits`); *unrelated*: every other pair. Precision is the pipeline's
(`search.search_shard`: top 10 videos per seed, best frame each; 10 s clips and
`outputs.stats_at`), at fixed τ and at τ = quantiles of the unrelated cosines, with
the mean number of a seed's unrelated and fitting frames at >= τ.
Also prints, for the oracle's reason, the share of (seed, scene) pairs showing exactly
what the seed image shows whose scene fits the caption, by whether the caption states a
motion (which no still shows: only a world written with `avworld.tools.mining_world
--seed_caption_motion` has such captions; its precision is capped by them).
--quick: the candidates raw and seed_mean at τ 0.8 only. Rows: each f's cosine percentiles
and AUC, and the precision table.
"""
import json
import pathlib

from absl import flags
import numpy as np

from avtext.data import video_io
from avtext.mining import beam_files
from avtext.mining import embed
from avtext.mining import outputs
from avtext.mining import pipeline
from avtext.mining import search
from avworld import captions
from avworld import mining_corpus
from avworld import world
from benchmarks import common

_WORLD = flags.DEFINE_string("world", "workdirs/demo/mining/world", "`make demo-mining`'s world")
_TOWER = flags.DEFINE_string("tower", "workdirs/demo/video_pretrain", "the stage-1 run")
_TAUS = flags.DEFINE_string("taus", "0.6,0.8,0.9,0.95,0.97,0.98", "fixed τ values")
SYSTEM = "VideoCC mining"
PAIRS = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]


def visible(attrs) -> np.ndarray:
  """What a still shows: objects' (shape, colour) counts, background, count (one-hot)."""
  v = np.zeros(len(PAIRS) + len(world.BACKGROUNDS) + world.MAX_OBJECTS + 1)
  for o in attrs['objects']:
    v[PAIRS.index((o['shape'], o['colour']))] += 1
  v[len(PAIRS) + world.BACKGROUNDS.index(attrs['background'])] = 1
  v[len(PAIRS) + len(world.BACKGROUNDS) + attrs['num_objects']] = 1
  return v


def tower_and_head(workdir: str):
  """(frames -> raw tower embeddings [N, D], head kernel, head bias) of a stage-1 run."""
  from avtext import runs as runs_lib  # pylint: disable=g-import-not-at-top
  head = runs_lib.load_run(workdir, None).params["head"]
  return (embed.tower(workdir, normalize=False), np.asarray(head["kernel"]),
          np.asarray(head["bias"]))


def candidates(seed_raw, frame_raw, kernel, bias, seed_oracle, frame_oracle):
  """{name: (seed unit vectors, frame unit vectors)} (module docstring)."""
  n = embed.l2_normalize
  s, f = n(seed_raw), n(frame_raw)
  mu_s, mu_f = s.mean(0), f.mean(0)
  x = n(f - mu_s)
  vals, vecs = np.linalg.eigh(np.cov(x.T, bias=True))
  zca = vecs @ np.diag(1 / np.sqrt(np.maximum(vals, 0.1 * vals.max()))) @ vecs.T
  keep = [k for k, name in enumerate(world.LABEL_NAMES) if not name.startswith("sound:")]
  ls, lf = (seed_raw @ kernel + bias)[:, keep], (frame_raw @ kernel + bias)[:, keep]

  def group_softmax(logits):
    names = [world.LABEL_NAMES[k].split(":")[0] for k in keep]
    out = np.zeros_like(logits)
    for g in dict.fromkeys(names):
      cols = [k for k, name in enumerate(names) if name == g]
      z = np.exp(logits[:, cols] - logits[:, cols].max(1, keepdims=True))
      out[:, cols] = z / z.sum(1, keepdims=True)
    return out

  return {"raw": (s, f), "seed_mean": (n(s - mu_s), n(f - mu_s)),
          "frame_mean": (n(s - mu_f), n(f - mu_f)),
          "whitened": (n(n(s - mu_s) @ zca), n(x @ zca)),
          "head logits": (n(ls), n(lf)),
          "head probs": (n(group_softmax(ls)), n(group_softmax(lf))),
          "oracle": (n(seed_oracle), n(frame_oracle))}


def pct(x, qs):
  return "/".join(f"{v:.2f}" for v in np.percentile(x, qs))


def main(argv):
  del argv
  videos_dir = pathlib.Path(_WORLD.value) / "videos"
  meta = json.loads((videos_dir / "world.json").read_text())
  w = mining_corpus.world_from_meta(meta)
  seeds = beam_files.read_seeds(pathlib.Path(_WORLD.value) / "seeds" / "seeds.tsv")
  rows = [meta["seeds"][sid] for sid, _, _ in seeds]
  seed_attrs = [w._seed(i)[0].attributes() for i in rows]  # pylint: disable=protected-access
  mentions = [w.seed_mention(i) for i in rows]
  cfg = pipeline.MiningConfig()
  raw, kernel, bias = tower_and_head(_TOWER.value)

  # The readable videos of >= t seconds, frames at 1 fps, as the pipeline decodes them.
  records, scene_attrs, scene_seed, frame_raw = [], [], [], []
  for vid, path in beam_files.list_videos(videos_dir):
    try:
      info = video_io.probe(path)
      if info.duration_s < cfg.clip_seconds:
        continue
      times = video_io.sample_times(info.duration_s, cfg.frames_hz)
      frames = video_io.read_frames(path, times)
    except video_io.VideoReadError:
      continue
    desc = w.describe_video(meta["videos"][vid])
    scenes = w.video(meta["videos"][vid]).scene_at(times)
    records.append((vid, path, info, times, scenes + sum(len(x) for x in scene_attrs)))
    scene_attrs.append([sc["attributes"] for sc in desc["scenes"]])
    scene_seed += [sc["seed"] for sc in desc["scenes"]]
    frame_raw.append(raw(frames))
  all_scenes = [x for per_video in scene_attrs for x in per_video]
  frame_scene = np.concatenate([r[4] for r in records])
  fit = np.array([[captions.caption_fits(m, x) for x in all_scenes] for m in mentions])
  planted = np.asarray(rows)[:, None] == np.asarray(scene_seed)[None, :]
  frame_fit, frame_planted = fit[:, frame_scene], planted[:, frame_scene]
  seed_raw = raw(np.stack([beam_files.load_image(pth, None) for _, pth, _ in seeds]))
  seed_oracle = np.stack([visible(x) for x in seed_attrs])
  frame_oracle = np.stack([visible(all_scenes[j]) for j in frame_scene])

  # Scenes showing exactly what the seed image shows: how many fit the caption.
  same = np.array([[np.array_equal(visible(sa), visible(x)) for x in all_scenes]
                   for sa in seed_attrs])
  states_motion = np.array([any("motion" in d for d in m.get("objects", ())) for m in mentions])
  print(f"{len(seeds)} seeds ({100 * states_motion.mean():.1f} % of captions state a motion), "
        f"{len(all_scenes)} scenes, {len(frame_scene)} frames in {len(records)} readable videos")
  print("\n| (seed, scene) pairs showing what the seed image shows | pairs | fit the caption (%) |"
        "\n|---|---|---|")
  for label, m in (("all", same), ("caption states no motion", same & ~states_motion[:, None]),
                   ("caption states a motion", same & states_motion[:, None])):
    share = f"{100 * fit[m].mean():.1f}" if m.any() else "-"
    print(f"| {label} | {m.sum()} | {share} |")

  frame_video = np.concatenate([np.full(len(r[3]), k) for k, r in enumerate(records)])
  times = np.concatenate([r[3] for r in records])
  truth, _ = outputs.corpus_truth(videos_dir)
  fixed = [0.8] if common.quick() else [float(t) for t in _TAUS.value.split(",")]
  world_note = ("seed captions that may state motion" if states_motion.any() else
                "seed captions of what a still shows")
  cosines = f"cosines of (seed, frame) pairs, {world_note}"
  precision_table = f"precision of the mined clips vs τ, {world_note}"
  print("\n| f | cosine, planted pairs p10/50/90 | fitting p10/50/90 | unrelated p50/99/99.9 "
        "| AUC fitting > unrelated |\n|---|---|---|---|---|")
  tables = []
  rng = np.random.default_rng(0)
  for name, (sv, fv) in candidates(np.concatenate([seed_raw]), np.concatenate(frame_raw),
                                   kernel, bias, seed_oracle, frame_oracle).items():
    if common.quick() and name not in ("raw", "seed_mean"):
      continue
    sims = (sv.astype(np.float64) @ fv.astype(np.float64).T)
    unrelated = sims[~frame_fit]
    auc = np.mean(rng.choice(sims[frame_fit], 200_000) > rng.choice(unrelated, 200_000))
    print(f"| {name} | {pct(sims[frame_planted], [10, 50, 90])} | "
          f"{pct(sims[frame_fit], [10, 50, 90])} | {pct(unrelated, [50, 99, 99.9])} | "
          f"{auc:.3f} |", flush=True)
    for column, value in (("planted p10/50/90", pct(sims[frame_planted], [10, 50, 90])),
                          ("fitting p10/50/90", pct(sims[frame_fit], [10, 50, 90])),
                          ("unrelated p50/99/99.9", pct(unrelated, [50, 99, 99.9])),
                          ("AUC fitting > unrelated", round(float(auc), 3))):
      common.record(SYSTEM, name, value, table=cosines, column=column)
    qs = {f"q{q}": float(np.percentile(unrelated, q)) for q in (99, 99.9, 99.99)}
    taus = sorted(set(fixed + list(qs.values())))
    found, _ = search.search_shard(sv, fv, frame_video, tau=min(taus), top_k=cfg.top_k)
    matches = [[sid, (m.sim, records[m.video][0], float(times[m.frame]),
                      records[m.video][2].duration_s, True, records[m.video][1])]
               for (sid, _, _), ms in zip(seeds, found) for m in ms]
    clip_rows = outputs._clip_rows(matches, {s: c for s, _, c in seeds}, cfg)  # pylint: disable=protected-access
    still = {sid for (sid, _, _), moves in zip(seeds, states_motion) if not moves}

    def precision(rows, tau):
      p = outputs.stats_at(rows, tau, cfg.top_k, truth)["precision"]
      return "-" if p is None else f"{100 * p:.1f}"

    for tau in taus:
      st = outputs.stats_at(clip_rows, tau, cfg.top_k, truth)
      label = next((f"{tau:.3f} (unrelated {k})" for k, v in qs.items() if v == tau), f"{tau}")
      passing = sims >= tau
      by_motion = " / ".join(precision([r for r in clip_rows if (r["seed_id"] in still) == s],
                                       tau) for s in (True, False))
      tables.append(f"| {name} | {label} | {st['matches']} | {st['clips']} | {st['captions']} "
                    f"| {precision(clip_rows, tau)} | {by_motion} "
                    f"| {(passing & ~frame_fit).sum(1).mean():.1f} / "
                    f"{(passing & frame_fit).sum(1).mean():.1f} |")
      metric = f"{name}, τ {label}"
      for column, value in (("matches", st["matches"]), ("clips", st["clips"]),
                            ("captions", st["captions"]),
                            ("precision", precision(clip_rows, tau)),
                            ("precision, captions stating no motion / a motion", by_motion),
                            ("a seed's frames >= τ, unrelated / fitting",
                             f"{(passing & ~frame_fit).sum(1).mean():.1f} / "
                             f"{(passing & frame_fit).sum(1).mean():.1f}")):
        unit = "%" if column == "precision" and value != "-" else ""
        common.record(SYSTEM, metric, float(value) if unit else value,
                      unit=unit, table=precision_table, column=column)
  print("\n| f | τ | matches | clips | captions | precision (%) | precision, captions stating "
        "no motion / a motion (%) | frames >= τ per seed, unrelated / fitting |"
        "\n|---|---|---|---|---|---|---|---|")
  print("\n".join(tables))


if __name__ == "__main__":
  common.main(main)

r"""Mine video clips for image captions (VideoCC §3.1) with Apache Beam.

    python -m avtext.mine --seeds=SEEDS.tsv --videos=DIR --workdir=TOWER_RUN [--step=N] \
        --out=OUT [--tau=0.6 --top_k=10 --clip_seconds=10 --center=none] [Beam options]

The pipeline, its inputs and outputs: `avtext.mining.pipeline`; runners, clusters and
Dataflow: docs/mining.md. The frame and image embedder is the vision tower of an avtext
run (--workdir, --step), or --embedder=callable:MODULE:NAME, any Python callable
`frames [N, H, W, 3] uint8 -> [N, D]`. Flags this program does not define are Beam
pipeline options (--runner, --direct_num_workers, --project, ...); an unknown one is an
error. Without --runner it runs on Beam's local engine with 2 worker processes;
--runner=DaskRunner with --dask_local_workers=N (a local Dask cluster) or
--dask_address=HOST:PORT (an existing one).
"""
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading

from absl import flags

from avtext import cli
from avtext import errors
from avtext.mining import beam_files
from avtext.mining import embed
from avtext.mining import pipeline
from avtext.mining import runners
from avtext.mining import search
from avtext.mining import stages
from avtext.train import rundir

_D = pipeline.MiningConfig()
FLAGS = flags.FlagValues()
_SEEDS = cli.DEFINE_path("seeds", None, "seeds.tsv: seed_id <TAB> image path <TAB> caption "
                         "(paths relative to the file)", flag_values=FLAGS)
_VIDEOS = cli.DEFINE_path("videos", None, "the corpus: every video file under this "
                          "directory (local or gs:// ...)", flag_values=FLAGS)
_WORKDIR = cli.DEFINE_path("workdir", None, "the run whose vision tower embeds frames and "
                           "seed images (e.g. workdirs/demo/video_pretrain)", flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS)
_EMBEDDER = flags.DEFINE_string("embedder", None, "instead of --workdir: "
                                "callable:MODULE:NAME, frames -> [N, D]", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the output directory (videocc.csv, dataset.json, "
                       "stats.json, ...)", flag_values=FLAGS)
_TAU = flags.DEFINE_float("tau", _D.tau, "the similarity threshold of a match (§3.2.1)",
                          flag_values=FLAGS)
_CENTER = flags.DEFINE_enum("center", _D.center, list(pipeline.MiningConfig.CENTERS),
                            "none: the paper's cosine of f; seed_mean: f minus the mean seed "
                            "vector, renormalized, for seeds and frames (an embedder whose "
                            "cosines are all high; BENCHMARKS.md 'VideoCC mining')",
                            flag_values=FLAGS)
_TOP_K = flags.DEFINE_integer("top_k", _D.top_k, "matches kept per seed (§3.1)",
                              lower_bound=1, flag_values=FLAGS)
_CLIP_SECONDS = flags.DEFINE_float("clip_seconds", _D.clip_seconds, "the length t of a mined "
                                   "clip, centred on the matched frame", flag_values=FLAGS)
_FRAMES_HZ = flags.DEFINE_float("frames_hz", _D.frames_hz, "frames per second searched",
                                flag_values=FLAGS)
_ALL_FRAMES = flags.DEFINE_bool("all_frames", False, "let a seed match several frames of one "
                                "video (default: one per video)", flag_values=FLAGS)
_TAU_GRID = flags.DEFINE_list("tau_grid", [str(t) for t in _D.tau_grid], "the thresholds "
                              "whose statistics stats.json reports (Fig. 5)", flag_values=FLAGS)
_SHARD_VIDEOS = flags.DEFINE_integer("shard_videos", _D.shard_videos, "videos per shard: one "
                                     "FAISS index each", lower_bound=1, flag_values=FLAGS)
_SHARD_SEEDS = flags.DEFINE_integer("shard_seeds", _D.shard_seeds, "seeds per shard: a worker "
                                    "holds one seed shard at a time", lower_bound=1,
                                    flag_values=FLAGS)
_SEED_FEATURES = cli.DEFINE_path("seed_features", None, "a [num_seeds, D] .npy of precomputed "
                                 "seed vectors (row i = line i of --seeds) instead of "
                                 "embedding the seed images", flag_values=FLAGS)
_DASK_ADDRESS = flags.DEFINE_string("dask_address", None, "with --runner=DaskRunner: "
                                    "HOST:PORT of an existing Dask scheduler",
                                    flag_values=FLAGS)
_DASK_LOCAL = flags.DEFINE_integer("dask_local_workers", None, "with --runner=DaskRunner: "
                                   "start a local Dask cluster of N worker processes",
                                   flag_values=FLAGS)
_EXACT_MAX = flags.DEFINE_integer("exact_max_frames", _D.index.exact_max_frames, "a shard "
                                  "with more frames searches an approximate index",
                                  flag_values=FLAGS)
_APPROX = flags.DEFINE_enum("approx", _D.index.approx, ["hnsw", "ivf"], "the approximate "
                            "index of large shards", flag_values=FLAGS)
_EF = flags.DEFINE_integer("hnsw_ef_search", _D.index.hnsw_ef_search, "HNSW's efSearch",
                           flag_values=FLAGS)
_NPROBE = flags.DEFINE_integer("ivf_nprobe", _D.index.ivf_nprobe, "IVF's nprobe",
                               flag_values=FLAGS)
_RECALL = flags.DEFINE_integer("recall_sample", _D.recall_sample, "seeds searched exactly "
                               "too, to report an approximate index's recall",
                               flag_values=FLAGS)
_EMBED_BATCH = flags.DEFINE_integer("embed_batch", _D.embed_batch, "images per embedder call",
                                    lower_bound=1, flag_values=FLAGS)
_IMAGE_SIZE = flags.DEFINE_list("image_size", None, "H,W to resize frames and seed images to "
                                "(default: as decoded)", flag_values=FLAGS)
_VERBOSE = flags.DEFINE_bool("verbose", False, "show Beam's own INFO lines and every "
                             "worker's log (default: the pipeline's progress, skips and "
                             "warnings)", flag_values=FLAGS)
flags.mark_flags_as_required(["seeds", "videos", "out"], flag_values=FLAGS)

# What Beam's local worker processes print on the shared stderr (they log at INFO: the
# direct runner does not hand them --default_sdk_harness_log_level), dropped unless
# --verbose; the pipeline's own lines (avtext.*) stay.
_WORKER_NOISE = re.compile(rb"^(INFO:(?!avtext)|WARNING:__main__:No semi_persistent_directory|"
                           rb"WARNING:root:apitools not found|"
                           rb"ModuleNotFoundError\(\"No module named 'faiss\.swigfaiss)")


@contextlib.contextmanager
def quiet_workers(verbose: bool, out: str):
  """This process' stderr (file descriptor 2, which Beam's worker processes inherit)
  goes through a filter that drops the workers' start-up lines (unless `verbose`).

  Ctrl-C (SIGINT to the whole process group: the workers too) or SIGTERM stops the run
  as one line, errors.Interrupted (130 / 143): from the signal on, every line the dying
  workers, Beam's threads and its loggers write is dropped (a wall of tracebacks, even
  with `verbose`), and `out` is as it was (`pipeline.build_and_run` writes it last)."""
  stopping = threading.Event()
  sys.stderr.flush()
  read, write = os.pipe()
  saved = os.dup(2)
  os.dup2(write, 2)
  os.close(write)

  def pump():
    with os.fdopen(read, "rb") as src, os.fdopen(os.dup(saved), "wb") as dst:
      for line in src:
        if not stopping.is_set() and (verbose or not _WORKER_NOISE.match(line)):
          dst.write(line)
          dst.flush()

  def stop(signum, frame):
    del frame
    stopping.set()
    raise errors.Interrupted(
        f"{'interrupted' if signum == signal.SIGINT else 'terminated'} "
        f"({signal.Signals(signum).name}): mining stopped; nothing was written to "
        f"--out={out} (what it held is as it was); re-run the same command to mine again",
        signum)

  thread = threading.Thread(target=pump, daemon=True)
  thread.start()
  handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  except BaseException:
    if stopping.is_set():  # Beam's threads and loggers report the workers' end: not here
      logging.disable(logging.CRITICAL)
      threading.excepthook = lambda args: None
    raise
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
    sys.stderr.flush()
    os.dup2(saved, 2)  # the pipe closes once the (finished) workers let go of it
    os.close(saved)
    if not stopping.is_set():
      thread.join(timeout=5)


def beam_options(args: list[str], program: str) -> list[str]:
  """The Beam options among `args`, checked against every option Beam defines; an
  unknown flag (a typo of ours or of Beam's) is an error naming the closest one."""
  # Beam's import warns of GCP client libraries a local run does not use (on its own
  # logger, and on the root logger: "apitools not found").
  logging.getLogger("apache_beam").setLevel(logging.ERROR)
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.ERROR)
  try:
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
    import apache_beam  # pylint: disable=g-import-not-at-top,unused-import
  finally:
    root.setLevel(level)
  parser = pipeline_options._BeamArgumentParser(allow_abbrev=False)  # pylint: disable=protected-access
  pending = list(pipeline_options.PipelineOptions.__subclasses__())
  while pending:
    cls = pending.pop()
    pending.extend(cls.__subclasses__())
    cls._add_argparse_args(parser)  # pylint: disable=protected-access
  beam_names = tuple(a.lstrip("-") for action in parser._actions  # pylint: disable=protected-access
                     for a in action.option_strings)
  positional = [a for a in args if not a.startswith("-")]
  if positional:
    raise errors.BadInput(f"unexpected arguments {positional}; see {program} --help")
  _, unknown = parser.parse_known_args(args)
  for arg in unknown:
    if arg.startswith("--"):
      raise errors.BadInput(cli.unknown_flag_message(arg[2:].split("=")[0], program, FLAGS,
                                                     beam_names).replace(
          "unknown flag", "unknown flag (neither this program's nor a Beam option)"))
  return list(args)


def embedder_name() -> str:
  if bool(_WORKDIR.value) == bool(_EMBEDDER.value):
    raise errors.BadInput("give the embedder: --workdir=RUN [--step=N] (a run's vision "
                          "tower) or --embedder=callable:MODULE:NAME")
  if _EMBEDDER.value:
    kind, _, rest = _EMBEDDER.value.partition(":")
    module, _, name = rest.partition(":")
    if kind != "callable" or not module or not name:
      raise errors.BadInput(f"--embedder={_EMBEDDER.value}: expected callable:MODULE:NAME "
                            "(a run's tower: --workdir=RUN [--step=N])")
    try:
      fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
      raise errors.BadInput(f"--embedder={_EMBEDDER.value}: {cli.exception_message(e)}; give "
                            "an importable MODULE and a NAME defined in it") from None
    if not callable(fn):
      raise errors.BadInput(f"--embedder={_EMBEDDER.value}: {module}.{name} is not callable; "
                            "give a function frames [N, H, W, 3] uint8 -> [N, D]")
    return _EMBEDDER.value
  workdir = _WORKDIR.value if "://" in _WORKDIR.value else os.path.abspath(_WORKDIR.value)
  embed.check_run(workdir, _STEP.value)
  return f"run:{workdir}" + (f"@{_STEP.value}" if _STEP.value else "")


def mining_config() -> pipeline.MiningConfig:
  """The flags' MiningConfig, each value checked (one line naming the flag)."""
  cosine = "a cosine lies in [-1, 1] (the paper's tau is 0.6; stats.json's random_pairs " \
           "quantiles show the embedder's scale)"
  cli.check_range("tau", _TAU.value, -1.0, 1.0, why=cosine)
  try:
    image_size = tuple(int(x) for x in _IMAGE_SIZE.value) if _IMAGE_SIZE.value else None
  except ValueError:
    raise errors.BadInput(f"--image_size={','.join(_IMAGE_SIZE.value)}: expected H,W (two "
                          "whole numbers of pixels, e.g. 224,224)") from None
  if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
    raise errors.BadInput(f"--image_size={','.join(_IMAGE_SIZE.value)}: expected H,W (two "
                          "whole numbers of pixels >= 1, e.g. 224,224)")
  tau_grid = []
  for t in _TAU_GRID.value:
    try:
      tau_grid.append(float(t))
    except ValueError:
      raise errors.BadInput(f"--tau_grid={','.join(_TAU_GRID.value)}: {t!r} is no number; "
                            "give thresholds like 0.5,0.6,0.7") from None
    cli.check_range("tau_grid", tau_grid[-1], -1.0, 1.0, why=cosine)
  for flag, low in ((_CLIP_SECONDS, 1e-3), (_FRAMES_HZ, 1e-3)):
    cli.check_range(flag.name, flag.value, low, why="a length / rate must be positive")
  for flag, low in ((_EXACT_MAX, 0), (_RECALL, 0), (_EF, 1), (_NPROBE, 1)):
    cli.check_range(flag.name, flag.value, low)
  cli.check_range("dask_local_workers", _DASK_LOCAL.value, 1)
  return pipeline.MiningConfig(
      tau=_TAU.value, center=_CENTER.value, top_k=_TOP_K.value, clip_seconds=_CLIP_SECONDS.value,
      frames_hz=_FRAMES_HZ.value, one_per_video=not _ALL_FRAMES.value,
      tau_grid=tuple(tau_grid), shard_videos=_SHARD_VIDEOS.value,
      shard_seeds=_SHARD_SEEDS.value,
      index=search.IndexConfig(exact_max_frames=_EXACT_MAX.value, approx=_APPROX.value,
                               hnsw_ef_search=_EF.value, ivf_nprobe=_NPROBE.value),
      recall_sample=_RECALL.value, embed_batch=_EMBED_BATCH.value, image_size=image_size)


def check_inputs() -> tuple[list, list, str, pipeline.MiningConfig]:
  """(seeds, videos, embedder, config): every input checked in this process before Beam
  starts (the flags' values, --out's kind and permission, the seeds file's structure,
  the videos folder, the tower run), so a mistake is one line, not a worker's trace."""
  cfg = mining_config()
  cli.check_output_dir("out", _OUT.value)
  cli.check_input_file("seeds", _SEEDS.value)
  if _SEED_FEATURES.value:
    cli.check_input_file("seed_features", _SEED_FEATURES.value)
  cli.check_input_dir("videos", _VIDEOS.value, "folder of videos")
  embedder = embedder_name()
  seeds = beam_files.read_seeds(_SEEDS.value)
  if _SEED_FEATURES.value:
    shape, _, _ = stages.npy_header(_SEED_FEATURES.value)
    if shape[0] != len(seeds):
      raise errors.BadInput(f"--seed_features={_SEED_FEATURES.value}: {shape[0]} rows for the "
                            f"{len(seeds)} seeds of --seeds; row i must be line i's vector")
  videos = beam_files.list_videos(_VIDEOS.value)
  if not videos:
    raise errors.InputNotFound(f"--videos={_VIDEOS.value}: no video files in it (looked for "
                               f"{', '.join(beam_files.VIDEO_EXTENSIONS)}, in subfolders too); "
                               "give the folder that holds the corpus")
  return seeds, videos, embedder, cfg


def check_result(out: str, stats: dict) -> None:
  """A run that mined nothing ends non-zero, saying why (`errors.NothingProduced`)."""
  skipped = sum(stats["skipped"].values())
  seeds_skipped = sum(stats["seeds_skipped"].values())
  listing = f"{out}/skipped.jsonl lists them"
  if seeds_skipped == stats["seeds"]:
    raise errors.NothingProduced(
        f"every seed image was skipped ({stats['seeds_skipped']}); {listing}: fix the image "
        "paths of --seeds (relative to the file)")
  if skipped == stats["videos_listed"]:
    raise errors.NothingProduced(
        f"every video was skipped ({stats['skipped']}); {listing}: fix or re-encode the "
        f"videos under --videos (clips need >= {_CLIP_SECONDS.value} s)")
  at_tau = next(r for r in stats["per_tau"] if r["tau"] == _TAU.value)
  if not at_tau["clips"]:
    scale = ""
    if stats["random_pairs"]:
      top = max(stats["random_pairs"]["cosine_quantiles"].values())
      scale = f" (99.99 % of sampled seed-frame cosines are <= {top:.3f})"
    raise errors.NothingProduced(
        f"no clip matched at --tau={_TAU.value}{scale}; {out}/stats.json has the counts at "
        "every tau of --tau_grid: lower --tau")


def main(argv):
  program = argv[0]
  beam_args = beam_options(list(argv[1:]), program)
  seeds, videos, embedder, cfg = check_inputs()
  if not any(x.startswith("--runner") for x in beam_args):
    # The direct runner's engine itself: Beam's DirectRunner first tries Prism, a binary
    # it downloads from GitHub at run time, and falls back to this one.
    beam_args = ["--runner=FnApiRunner"] + beam_args
    if not any(x.startswith("--direct_num_workers") for x in beam_args):
      beam_args += ["--direct_num_workers=2"]
    if not any(x.startswith("--direct_running_mode") for x in beam_args):
      beam_args += ["--direct_running_mode=multi_processing"]
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  if not _VERBOSE.value:
    # Beam's own INFO lines (and its relay of each worker's log, which the workers also
    # print themselves) would bury the pipeline's progress and skip messages.
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(
        logging.ERROR)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
      beam_args += ["--default_sdk_harness_log_level=WARNING",
                    '--sdk_harness_log_level_overrides={"avtext": "INFO"}']
  # One process writes --out at a time (a remote one is the cluster's to guard).
  lock = (contextlib.nullcontext() if beam_files.is_remote(_OUT.value)
          else rundir.output_lock(_OUT.value, "out"))
  with lock, quiet_workers(_VERBOSE.value, _OUT.value), runners.beam_args_for(beam_args, dask_address=_DASK_ADDRESS.value,
                                   dask_local_workers=_DASK_LOCAL.value) as beam_args:
    info = pipeline.build_and_run(_SEEDS.value, _VIDEOS.value, embedder, _OUT.value, cfg,
                                  beam_args, seed_features=_SEED_FEATURES.value,
                                  seeds=seeds, videos=videos)
  stats = info["stats"]
  seeds_skipped = sum(stats["seeds_skipped"].values())
  print(f"mined {_OUT.value}: {stats['videos_searched']}/{stats['videos_listed']} videos "
        f"searched, skipped {stats['skipped'] or 'none'}; "
        f"{stats['seeds'] - seeds_skipped}/{stats['seeds']} seeds, skipped "
        f"{stats['seeds_skipped'] or 'none'}; {info['frames']} frames in "
        f"{info['seconds']:.1f} s")
  print("tau   matches  clips  videos  captions  precision")
  for row in stats["per_tau"]:
    prec = row.get("precision")
    print(f"{row['tau']:.2f}  {row['matches']:7d}  {row['clips']:5d}  {row['videos']:6d}  "
          f"{row['captions']:8d}  {'-' if prec is None else f'{100 * prec:.1f} %'}")
  if stats["random_pairs"]:
    q = stats["random_pairs"]["cosine_quantiles"]
    print(f"cosines of {stats['random_pairs']['pairs']} (sample seed, frame) pairs, nearly all "
          "unrelated: " + ", ".join(f"{k} % <= {v:.3f}" for k, v in q.items()))
  if info["peak_worker_rss_mb"] is not None:
    driver = next(w["peak_rss_mb"] for w in info["workers"] if w["worker"] == "driver")
    print(f"peak memory (RSS): {info['peak_worker_rss_mb']:.0f} MiB in the largest of "
          f"{len(info['workers']) - 1} worker processes, {driver:.0f} MiB in this one "
          "(run.json)")
  if info["approx_recall"] is not None:
    print(f"approximate index recall vs exact: {100 * info['approx_recall']:.1f} %")
  check_result(_OUT.value, stats)  # before the result line: a run that mined nothing has none
  print(json.dumps({"csv": f"{_OUT.value}/videocc.csv", "dataset": f"{_OUT.value}/dataset.json"}))


if __name__ == "__main__":
  cli.run(main, FLAGS, known_only=True)

r"""Input pipeline at paper scale (AVR): train clips/s per host core, and cores per chip.

    python -m benchmarks.speed.pipeline_scale [--out=workdirs/bench/pipeline_scale] [--clips=24]
        [--height=360 --width=640 --duration_s=26] [--grains=0,2.5] [--short_side=224]
        [--sources=files,tfds,frames] [--jpeg_quality=95] [--core=0]
        [--per_chip_batch=16 --v5e_step_s=0.535,1.02 --gpu_clips_per_s=150,86.8]

1. Writes `--clips` synthetic clips as H.264 + AAC mp4s in the videocc3m layout
   (`avworld.layouts`), `--width`x`--height` at 25 fps, `--duration_s` long
   (>= 25 s, so the paper's 24 s of log-mel windows and 17.9 s of frames fit), once per
   `--grains` value: 0 is the synthetic world as the layouts tool writes it (flat shapes,
   ~110 kbit/s: cheaper to decode than real footage); g > 0 adds Gaussian noise of std g
   grey levels to every frame before encoding (2.5: ~400 kbit/s, 4: ~3.5 Mbit/s at 360p),
   standing in for the bits real footage costs.
2. Stores the same clips with `avtext.data.clip_export` (frames resized on decode to
   `--short_side`, as `python -m avtext.materialize --short_side` does) in two formats:
   `tfds` (one record per clip, all its frames in one zlib'd tensor) and `frames_jpeg` at
   `--jpeg_quality` (one JPEG record per frame, `avtext.data.framestore`: a read decodes
   only the sampled frames).
3. Times the TRAIN examples of the paper config (`configs/videocc_avr.py`, task AVR's
   `examples(source, train=True)`: 32 frames at stride 14, a random crop resized to 224 px,
   8 x 100 x 128 log-mel, 32 BERT tokens) from the files (`videocc3m`), the TFDS copy
   (`tfds:<name>`) and the frame store (`frames:<name>`), each in a child process pinned
   to ONE core (`taskset -c --core`) with one worker thread; the first `--warmup` clips are
   discarded. Also times the read alone (`ClipReader.read`: frames and audio windows, no
   preprocessing). Rates per wall second and per CPU second of the pinned process (the
   latter leaves out time other processes took from the core).
4. Host cores an accelerator needs = (clips it trains a second) / (train clips per CPU-s):
   a v5e chip at `--per_chip_batch` clips per step of each `--v5e_step_s` (0.535 s: AVR at
   45 % MFU; 1.02 s: the AOT bound today), against the 28 vCPUs a v5e host has per chip;
   one H100 at each `--gpu_clips_per_s` (150: 45 % MFU; 86.8: measured, BENCHMARKS.md
   "AVR paper model on one H100"), against the 26 vCPUs per GPU of an 8 x H100 host.
   The host shapes are Google's published machine types, not measured here.

Clips and stores are kept under --out and reused by a rerun (which then only times).
--quick: 6 clips of 160x90, grain 0, the frame store only. Rows: per store the read and the
train example's CPU ms a clip and train clips per core, and the cores each accelerator
needs.
"""
import json
import os
import pathlib
import subprocess
import time

from absl import flags

from benchmarks import common

STORE_NAME = {'tfds': 'pipeline_scale_avr', 'frames': 'pipeline_scale_avr_frames'}
SOURCES = ('files', 'tfds', 'frames')
# Published machine shapes (not measured here). Cloud TPU v5e (cloud.google.com/tpu/docs/v5e,
# "VM types"): ct5lp-hightpu-8t has 8 chips and 224 vCPUs, -4t 4 and 112: 28 a chip.
# 8 x H100 (cloud.google.com/compute/docs/gpus, A3): a3-highgpu-8g has 208 vCPUs: 26 a GPU.
HOST_VCPUS = {'v5e chip': 224 / 8, 'H100': 208 / 8}


_CLIPS = flags.DEFINE_integer("clips", 24, "clips written and timed per grain")
_HEIGHT = flags.DEFINE_integer("height", 360, "clip height")
_WIDTH = flags.DEFINE_integer("width", 640, "clip width")
_DURATION = flags.DEFINE_float("duration_s", 26.0, "clip length (>= 25 s)")
_GRAINS = flags.DEFINE_list("grains", ["0", "2.5"], "one set of clips per value: noise std "
                            "in grey levels (0: the synthetic world as layouts writes it)")
_SHORT_SIDE = flags.DEFINE_integer("short_side", 224, "materialize: frames resized on decode "
                                   "to this shorter side")
_JPEG_QUALITY = flags.DEFINE_integer("jpeg_quality", 95, "frames_jpeg quality")
_WARMUP = flags.DEFINE_integer("warmup", 3, "clips timed and discarded")
_CORE = flags.DEFINE_integer("core", 0, "the core the timing runs on")
_SOURCES = flags.DEFINE_list("sources", list(SOURCES), "files, tfds, frames")
_PER_CHIP_BATCH = flags.DEFINE_integer("per_chip_batch", 16, "clips per v5e chip per step "
                                       "(AVR: 256 on 16 chips)")
_V5E_STEP_S = flags.DEFINE_list("v5e_step_s", ["0.535", "1.02"], "v5e step times: AVR at "
                                "45 % MFU, the AOT bound")
_GPU_CLIPS = flags.DEFINE_list("gpu_clips_per_s", ["150", "86.8"], "clips/s one H100 trains: "
                               "at 45 % MFU, measured (26 %)")
_MEASURE = flags.DEFINE_string("measure", None, "(child process) a dataset as JSON")
SYSTEM = "Input pipeline"


def paper_config(dataset: dict):
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = common.load_config("configs/videocc_avr.py")
  config.dataset = ml_collections.ConfigDict({'progress': False, **dataset})
  return config


# ---- the pinned child: one source, one thread ---------------------------------------

def measure(dataset: dict, warmup: int) -> dict:
  """{'read': ..., 'full': ...} rates of the AVR train examples of `dataset`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  config = paper_config(dataset)
  t0 = time.perf_counter()
  task = task_registry.build_task(config)
  source = task.train_source
  examples = task.examples(source, train=True)
  open_s = time.perf_counter() - t0
  n = len(source) - warmup
  if n < 4:
    raise ValueError(f'{len(source)} clips: need at least warmup + 4 = {warmup + 4}')
  rng = lambda i: np.random.default_rng(i)  # noqa: E731
  fi, aw = examples._frame_indices, examples._audio_windows  # pylint: disable=protected-access
  fns = {'read': lambda i: examples.reader.read(i, fi(rng(i)), aw, examples.modalities),
         'full': lambda i: examples(i, rng(i))}
  out = {'clips': len(source), 'warmup': warmup, 'open_s': open_s,
         'affinity': sorted(os.sched_getaffinity(0))}
  for name, fn in fns.items():
    for i in range(warmup - 1):
      fn(i)
    order = iter(range(warmup - 1, len(source)))  # _rate's own warm call takes warmup - 1
    cpu = []

    def call(_, fn=fn, order=order, cpu=cpu):
      i = next(order)
      c = time.process_time()
      ex = fn(i)
      cpu.append(time.process_time() - c)
      return ex

    wall_rate = common.rate(call, n, threads=1)
    out[name] = {'clips_per_s': wall_rate, 'clips_per_cpu_s': n / sum(cpu[1:]),
                 'cpu_ms_per_clip': 1e3 * sum(cpu[1:]) / n, 'n': n}
  ex = examples(0, rng(0))
  out['shapes'] = {k: [list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in ex.items()}
  return out


def run_child(dataset: dict, core: int, warmup: int) -> dict:
  cmd = ['taskset', '-c', str(core), *common.child(f'--measure={json.dumps(dataset)}',
                                                   f'--warmup={warmup}')]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'OMP_NUM_THREADS': '1',
         'OPENBLAS_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'TF_NUM_INTEROP_THREADS': '1',
         'TF_NUM_INTRAOP_THREADS': '1', 'TF_CPP_MIN_LOG_LEVEL': '3'}
  load = os.getloadavg()
  p = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True,
                     check=False)
  if p.returncode:
    raise SystemExit(f'measurement failed: {" ".join(cmd)}\n{p.stderr[-4000:]}')
  out = json.loads(p.stdout.strip().splitlines()[-1])
  out['load'] = [load, os.getloadavg()]
  return out


# ---- the parent: data, children, table ----------------------------------------------

def dir_mb(path: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 1e6


def write_clips(root: pathlib.Path, n: int, spec, grain: float) -> float:
  """The videocc3m layout of `n` world clips under `root`; with `grain` > 0, every frame
  gets Gaussian noise of that std (grey levels; 7 noise fields cycled) before encoding, so
  the bitrate and the zlib ratio of the frames are nearer real footage. Returns kbit/s."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  from avworld import layouts  # pylint: disable=g-import-not-at-top
  if grain > 0:
    # Written first at the paths layouts.write uses (videos/train<i:05d>.mp4); it then
    # skips them (it writes no file that exists) and writes video_cc_public.csv.
    src = layouts.source('train', n, spec, 0, 'videocc3m')
    rng = np.random.default_rng(0)
    shape = (spec.height, spec.width, 3)
    pool = [np.round(rng.normal(0, grain, shape)).astype(np.int16) for _ in range(7)]
    for i in tqdm(range(n), desc=f'writing grain {grain:g} clips'):
      path = root / 'videos' / f'train{i:05d}.mp4'
      if path.exists():
        continue
      path.parent.mkdir(parents=True, exist_ok=True)
      frames, audio = layouts._media(src, i, spec)  # pylint: disable=protected-access
      for t, f in enumerate(frames):
        frames[t] = np.clip(f + pool[t % len(pool)], 0, 255)
      tmp = path.with_name('.tmp.mp4')
      video_io.write_video(tmp, frames, spec.fps, audio=audio, sample_rate=spec.sample_rate)
      tmp.rename(path)
  layouts.write('videocc3m', root, sizes={'train': n}, spec=spec, progress=True)
  mp4 = [root / 'videos' / f'train{i:05d}.mp4' for i in range(n)]
  return 8 * sum(f.stat().st_size for f in mp4) / 1e3 / (n * spec.duration_s)


def main(argv):
  del argv
  if _MEASURE.value:
    print(json.dumps(measure(json.loads(_MEASURE.value), _WARMUP.value)))
    return
  from avtext.data import clip_export  # pylint: disable=g-import-not-at-top
  from avworld import world  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  quick = common.quick()
  clips, width, height = (6, 160, 90) if quick else (_CLIPS.value, _WIDTH.value, _HEIGHT.value)
  grains = ["0"] if quick else _GRAINS.value
  sources = ["frames"] if quick else [x for x in SOURCES if x in _SOURCES.value]
  out = common.out_dir().resolve()
  duration, short_side, quality = _DURATION.value, _SHORT_SIDE.value, _JPEG_QUALITY.value
  spec = world.WorldSpec(height=height, width=width, duration_s=duration)
  frame_mb = duration * spec.fps * 3 * short_side * round(
      short_side * max(width, height) / min(width, height)) / 1e6
  runs = []
  for grain in (float(g) for g in grains):
    run = {'grain': grain}
    root = out / f'videocc3m_{width}x{height}_{duration:g}s_{clips}_grain{grain:g}'
    t = time.perf_counter()
    run['kbit_per_s'] = write_clips(root, clips, spec, grain)
    run['write_s'] = time.perf_counter() - t
    print(f'{clips} mp4s under {root} ({run["write_s"]:.0f} s), '
          f'{run["kbit_per_s"]:.0f} kbit/s', flush=True)
    data_dir = out / f'stores_{root.name}_s{short_side}'
    names = {'tfds': STORE_NAME['tfds'], 'frames': f'{STORE_NAME["frames"]}_q{quality}'}
    datasets = {'files': {'name': 'videocc3m', 'path': str(root)},
                'tfds': {'name': f'tfds:{names["tfds"]}', 'data_dir': str(data_dir)},
                'frames': {'name': f'frames:{names["frames"]}', 'data_dir': str(data_dir)}}
    run['mb_per_clip'], run['materialize_s'] = {}, {}
    for fmt, done in (('tfds', 'skipped.json'), ('frames', 'train/info.json')):
      if fmt not in sources:
        continue
      if not (data_dir / names[fmt] / done).exists():
        t = time.perf_counter()
        summary = clip_export.materialize(
            ml_collections.ConfigDict({**datasets['files'], 'short_side': short_side,
                                       'progress': False}),
            ['train'], name=names[fmt], data_dir=data_dir, quality=quality,
            fmt='tfds' if fmt == 'tfds' else 'frames_jpeg', workers=os.cpu_count() or 1)
        run['materialize_s'][fmt] = time.perf_counter() - t
        print(f'materialized {summary} as {fmt} in {run["materialize_s"][fmt]:.0f} s under '
              f'{data_dir}')
      run['mb_per_clip'][fmt] = dir_mb(data_dir / names[fmt]) / clips
    print(f'stores, MB per clip: {run.get("mb_per_clip")} ({frame_mb:.0f} MB of uint8 '
          'frames uncompressed)', flush=True)
    for name in sources:
      print(f'timing {name} on core {_CORE.value} (load average {os.getloadavg()}) ...',
            flush=True)
      run[name] = run_child(datasets[name], _CORE.value, _WARMUP.value)
      print(json.dumps(run[name]), flush=True)
    runs.append(run)
  report(runs, sources, clips, width, height, out)


def needs() -> dict[str, dict[str, float]]:
  """{accelerator: {what: clips/s it trains}} from the flags."""
  v5e = {f'{t:g} s step': _PER_CHIP_BATCH.value / t for t in map(float, _V5E_STEP_S.value)}
  gpu = {f'{r:g} clips/s': r for r in map(float, _GPU_CLIPS.value)}
  return {'v5e chip': v5e, 'H100': gpu}


def report(runs: list[dict], sources: list[str], clips: int, width: int, height: int,
           out: pathlib.Path) -> None:
  targets = needs()
  short_side, quality = _SHORT_SIDE.value, _JPEG_QUALITY.value
  print()
  print('Clips/s to feed: ' + '; '.join(
      f'{acc} at {what}: {rate:.1f}' for acc, t in targets.items() for what, rate in t.items())
      + '. Host vCPUs (published): ' + ', '.join(f'{k} {v:g}' for k, v in HOST_VCPUS.items()))
  print()
  cols = [(acc, what) for acc, t in targets.items() for what in t]
  print('| clips | source | stage | clips/s per core (wall) | clips per CPU-s | CPU ms / clip | '
        + ' | '.join(f'cores per {acc} at {what}' for acc, what in cols)
        + ' | load avg (1 min) |')
  print('|---|---|---|---|---|---|' + '---|' * len(cols) + '---|')
  names = {'files': 'mp4 files', 'tfds': 'tfds', 'frames': 'frames_jpeg'}
  for run in runs:
    clip = f'{width}x{height}, grain {run["grain"]:g}, {run["kbit_per_s"]:.0f} kbit/s'
    mb = run.get('mb_per_clip', {})
    labels = {'files': 'mp4 files',
              'tfds': f'tfds, a record per clip ({short_side} px, {mb.get("tfds", 0):.1f} MB/clip)',
              'frames': (f'frames_jpeg q{quality} ({short_side} px, '
                         f'{mb.get("frames", 0):.1f} MB/clip)')}
    for name in sources:
      r = run[name]
      metric = f'{clip}: {names[name]}' + (f' ({mb[name]:.1f} MB a clip)' if name in mb else '')
      table = (f'{clips} clips of {width}x{height} a grain, read by the AVR paper config\'s train '
               'examples, one pinned core')
      for stage, label in (('read', 'read only'), ('full', 'train example')):
        x = r[stage]
        cores = ' | '.join(f'{targets[acc][what] / x["clips_per_cpu_s"]:.2f}'
                           for acc, what in cols)
        print(f'| {clip} | {labels[name]} | {label} | {x["clips_per_s"]:.2f} | '
              f'{x["clips_per_cpu_s"]:.2f} | {x["cpu_ms_per_clip"]:.0f} | {cores} | '
              f'{r["load"][0][0]:.2f} -> {r["load"][1][0]:.2f} |')
        common.record(SYSTEM, metric, x['cpu_ms_per_clip'], unit='ms', table=table,
                      column=f'{label}, CPU per clip', digits=3)
      common.record(SYSTEM, metric, r['full']['clips_per_cpu_s'], table=table,
                    column='train clips/s per core', digits=3)
      for acc, t in targets.items():
        for what, clips_per_s in t.items():
          cores = clips_per_s / r['full']['clips_per_cpu_s']
          common.record(SYSTEM, metric, f'{cores:.1f} ({100 * cores / HOST_VCPUS[acc]:.0f} %)',
                        table='host cores (and share of the host\'s vCPUs) an accelerator '
                        'needs', column=f'a {acc} at {what}')
  print()
  for run in runs:
    for name in sources:
      rate = run[name]['full']['clips_per_cpu_s']
      parts = []
      for acc, t in targets.items():
        for what, clips_per_s in t.items():
          cores = clips_per_s / rate
          parts.append(f'{acc} at {what}: {cores:.2f} cores, {100 * cores / HOST_VCPUS[acc]:.0f} % '
                       f'of {HOST_VCPUS[acc]:g}')
      print(f'grain {run["grain"]:g}, {name}: ' + '; '.join(parts))
  out_json = out / f'results_grains{"_".join(_GRAINS.value)}.json'
  out_json.write_text(json.dumps({'targets': targets, 'host_vcpus': HOST_VCPUS, 'runs': runs},
                                 indent=1, default=str))
  print(f'wrote {out_json}')


if __name__ == '__main__':
  common.main(main)

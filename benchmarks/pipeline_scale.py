r"""Input pipeline at paper scale (AVR): train clips/s per host core, and cores per chip.

    python benchmarks/pipeline_scale.py [--out=workdirs/bench/pipeline_scale] [--clips=24]
        [--height=360 --width=640 --duration_s=26] [--grains=0,2.5] [--short_side=224]
        [--sources=files,tfds,jpeg] [--step_bound_s=S | --aot_json=FILE] [--core=0]

1. Writes `--clips` synthetic clips as H.264 + AAC mp4s in the videocc3m layout
   (`avtext.data.synthetic.layouts`), `--width`x`--height` at 25 fps, `--duration_s` long
   (>= 25 s, so the paper's 24 s of log-mel windows and 17.9 s of frames fit), once per
   `--grains` value: 0 is the synthetic world as the layouts tool writes it (flat shapes,
   ~110 kbit/s: cheaper to decode than real footage); g > 0 adds Gaussian noise of std g
   grey levels to every frame before encoding (2.5: ~400 kbit/s, 4: ~3.5 Mbit/s at 360p),
   standing in for the bits real footage costs.
2. Stores the same clips as array_record with `avtext.data.materialize` (frames resized on
   decode to `--short_side`, as `python -m avtext.materialize --short_side` does), and
   (source `jpeg`, a sketch: avtext has no such store) re-encodes that copy's frames as one
   JPEG each (`JpegClips`), so a read decodes only the sampled frames.
3. Times the TRAIN examples of the paper config (`configs/videocc_avr.py`, task AVR's
   `examples(source, train=True)`: 32 frames at stride 14, a random crop resized to 224 px,
   8 x 100 x 128 log-mel, 32 BERT tokens) from the files (`videocc3m`), the materialized
   copy (`tfds:<name>`) and the sketch, each in a child process pinned to ONE core
   (`taskset -c --core`) with one worker thread; the first `--warmup` clips are discarded.
   Also times the read alone (`ClipReader.read`: frames and audio windows, no
   preprocessing). Rates per wall second and per CPU second of the pinned process (the
   latter leaves out time other processes took from the core).
4. Cores per chip = (clips per chip per step / step time) / (clips per CPU-s), at the step
   lower bound from --step_bound_s, else the videocc_avr row of a `benchmarks/aot_table.py
   --out` JSON lines file (--aot_json), else 1.60 s per 256-clip step on v5e:4x4 (16 chips)
   -- and at the bound's compute part alone when known (the step if the HBM-traffic
   estimate is loose). Printed as markdown beside the vCPUs a v5e host has per chip
   (Google's published machine shapes, not measured here).

Clips and stores are kept under --out and reused by a rerun (which then only times).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'benchmarks'))

import decode_throughput  # pylint: disable=wrong-import-position

TFDS_NAME = 'pipeline_scale_avr'
SOURCES = ('files', 'tfds', 'jpeg')
# Cloud TPU v5e VM shapes as Google publishes them (https://cloud.google.com/tpu/docs/v5e,
# "VM types"): ct5lp-hightpu-1t 1 chip / 24 vCPUs, -4t 4 / 112, -8t 8 / 224; v5e:4x4 is
# 2 hosts of 8 chips. Not measured here.
V5E_VCPUS_PER_CHIP = {'ct5lp-hightpu-8t (8 chips, 224 vCPUs)': 224 / 8,
                      'ct5lp-hightpu-4t (4 chips, 112 vCPUs)': 112 / 4}
# Without --aot_json / --step_bound_s: 1.60 s, the figure issue 27's brief gives (avtext.aot
# on videocc_avr for v5e:4x4, its HBM-traffic bound), and 0.146 s, the compute_bound_s of
# that same avtext.aot run (its JSON, /tmp/aot/avr_4x4.json on the dev VM, 2026-11-25).
DEFAULT_BOUND = {'step_time_lower_bound_s': 1.60, 'compute_bound_s': 0.146,
                 'global_batch': 256, 'chips': 16, 'topology': 'v5e:4x4',
                 'source': 'default: 1.60 s per step of 256 clips on v5e:4x4 (the HBM-traffic '
                           'bound issue 27 gives; compute part 0.146 s from the same avtext.aot '
                           'run), not read from an aot_table.py output'}


def paper_config(dataset: dict):
  from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = videocc_avr.get_config()
  config.dataset = ml_collections.ConfigDict({'progress': False, **dataset})
  return config


# ---- a sketch of a store that reads only the sampled frames ---------------------------

class JpegClips:
  """A 'clips' source over per-frame JPEGs: what a materialized store could hold instead of
  one zlib'd array of every frame of a clip (avtext has no such store; this is the sketch
  the table times). Clip i is <root>/<i>.jpg.npy (the JPEG bytes of every frame, end to
  end), <i>.off.npy (their offsets) and <i>.wav.npy (float32 16 kHz audio), memory-mapped;
  render_frames decodes only the frames asked for (PIL), so ClipReader's lazy path reads 32
  JPEGs and the audio span of a train clip."""
  kind = 'clips'

  def __init__(self, root: str):
    self.root = pathlib.Path(root)
    self.meta = json.loads((self.root / 'meta.json').read_text())

  def __len__(self) -> int:
    return len(self.meta['clips'])

  def describe(self, index: int) -> dict:
    m = self.meta['clips'][index]
    return {**m, 'attributes': None}

  def render_frames(self, index: int, frame_indices):
    import io  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from PIL import Image  # pylint: disable=g-import-not-at-top
    data = np.load(self.root / f'{index}.jpg.npy', mmap_mode='r')
    off = np.load(self.root / f'{index}.off.npy')
    idx = np.minimum(np.asarray(frame_indices).reshape(-1), len(off) - 2)
    return np.stack([np.asarray(Image.open(io.BytesIO(data[off[k]:off[k + 1]].tobytes()))
                               .convert('RGB')) for k in idx])

  def render_audio(self, index: int, start_sample: int, num_samples: int):
    import numpy as np  # pylint: disable=g-import-not-at-top
    wave = np.load(self.root / f'{index}.wav.npy', mmap_mode='r')
    return np.array(wave[start_sample:start_sample + num_samples], np.float32)


def write_jpeg_store(tfds_data_dir: pathlib.Path, root: pathlib.Path, quality: int) -> None:
  """`JpegClips` files from the materialized array_record copy (its frames re-encoded)."""
  import io  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  if (root / 'meta.json').exists():
    return
  root.mkdir(parents=True, exist_ok=True)
  records = tfds.data_source(TFDS_NAME, split='train', data_dir=str(tfds_data_dir),
                             download=False)
  meta = []
  for i in tqdm(range(len(records)), desc=f'JPEG q{quality} per frame'):
    ex = records[i]
    blobs = []
    for f in ex['frames']:
      buf = io.BytesIO()
      Image.fromarray(f).save(buf, format='JPEG', quality=quality)
      blobs.append(buf.getvalue())
    np.save(root / f'{i}.jpg.npy', np.frombuffer(b''.join(blobs), np.uint8))
    np.save(root / f'{i}.off.npy', np.cumsum([0] + [len(b) for b in blobs]))
    np.save(root / f'{i}.wav.npy', np.asarray(ex['audio'], np.float32))
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
    meta.append({'caption': text(ex['caption']), 'clip_id': text(ex['clip_id']),
                 'video_id': text(ex['video_id']), 'has_audio': bool(ex['has_audio']),
                 'num_frames': len(ex['frames']), 'num_samples': len(ex['audio'])})
  (root / 'meta.json').write_text(json.dumps({'quality': quality, 'clips': meta}))


# ---- the pinned child: one source, one thread ---------------------------------------

def measure(dataset: dict, warmup: int) -> dict:
  """{'read': ..., 'full': ...} rates of the AVR train examples of `dataset`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  config = paper_config(dataset)
  t0 = time.perf_counter()
  task = registry.build_task(config)
  source = JpegClips(dataset['path']) if dataset['name'] == 'jpeg' else task.train_source
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

    wall_rate = decode_throughput._rate(call, n, threads=1)  # pylint: disable=protected-access
    out[name] = {'clips_per_s': wall_rate, 'clips_per_cpu_s': n / sum(cpu[1:]),
                 'cpu_ms_per_clip': 1e3 * sum(cpu[1:]) / n, 'n': n}
  ex = examples(0, rng(0))
  out['shapes'] = {k: [list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in ex.items()}
  return out


def run_child(dataset: dict, args) -> dict:
  cmd = ['taskset', '-c', str(args.core), sys.executable, __file__, '--_measure',
         json.dumps(dataset), f'--warmup={args.warmup}']
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'OMP_NUM_THREADS': '1',
         'OPENBLAS_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'TF_NUM_INTEROP_THREADS': '1',
         'TF_NUM_INTRAOP_THREADS': '1', 'TF_CPP_MIN_LOG_LEVEL': '3'}
  load = os.getloadavg()
  p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
  if p.returncode:
    sys.stderr.write(p.stderr[-4000:])
    raise SystemExit(f'measurement failed: {" ".join(cmd)}')
  out = json.loads(p.stdout.strip().splitlines()[-1])
  out['load'] = [load, os.getloadavg()]
  return out


# ---- the parent: data, children, table ----------------------------------------------

def step_bound(args) -> dict:
  if args.step_bound_s:
    return {'step_time_lower_bound_s': args.step_bound_s, 'global_batch': 256, 'chips': 16,
            'topology': 'v5e:4x4',
            'source': f'--step_bound_s={args.step_bound_s} (256 clips on v5e:4x4 assumed)'}
  if args.aot_json and pathlib.Path(args.aot_json).exists():
    for line in pathlib.Path(args.aot_json).read_text().splitlines():
      r = json.loads(line) if line.strip() else {}
      if r.get('name') == 'videocc_avr' and 'step_time_lower_bound_s' in r:
        return {**r, 'source': f'{args.aot_json} (benchmarks/aot_table.py, videocc_avr row)'}
    print(f'{args.aot_json}: no videocc_avr row with a step bound; using the default')
  return dict(DEFAULT_BOUND)


def dir_mb(path: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 1e6


def write_clips(root: pathlib.Path, n: int, spec, grain: float) -> float:
  """The videocc3m layout of `n` world clips under `root`; with `grain` > 0, every frame
  gets Gaussian noise of that std (grey levels; 7 noise fields cycled) before encoding, so
  the bitrate and the zlib ratio of the frames are nearer real footage. Returns kbit/s."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  from avtext.data import video_io  # pylint: disable=g-import-not-at-top
  from avtext.data.synthetic import layouts  # pylint: disable=g-import-not-at-top
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


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='workdirs/bench/pipeline_scale')
  parser.add_argument('--clips', type=int, default=24)
  parser.add_argument('--height', type=int, default=360)
  parser.add_argument('--width', type=int, default=640)
  parser.add_argument('--duration_s', type=float, default=26.0)
  parser.add_argument('--grains', default='0,2.5',
                      help='one set of clips per value: noise std in grey levels (0: the '
                           'synthetic world as layouts writes it)')
  parser.add_argument('--short_side', type=int, default=224,
                      help='materialize: frames resized on decode to this shorter side')
  parser.add_argument('--jpeg_quality', type=int, default=90)
  parser.add_argument('--warmup', type=int, default=3, help='clips timed and discarded')
  parser.add_argument('--core', type=int, default=0, help='the core the timing runs on')
  parser.add_argument('--step_bound_s', type=float, default=None)
  parser.add_argument('--aot_json', default=None)
  parser.add_argument('--sources', default='files,tfds,jpeg')
  parser.add_argument('--_measure', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  child = args._measure  # pylint: disable=protected-access
  if child:
    print(json.dumps(measure(json.loads(child), args.warmup)))
    return

  from avtext.data import materialize  # pylint: disable=g-import-not-at-top
  from avtext.data.synthetic import world  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  out = pathlib.Path(args.out).resolve()
  spec = world.WorldSpec(height=args.height, width=args.width, duration_s=args.duration_s)
  sources = [x for x in SOURCES if x in args.sources.split(',')]
  frame_mb = args.duration_s * spec.fps * 3 * args.short_side * round(
      args.short_side * max(args.width, args.height) / min(args.width, args.height)) / 1e6
  runs = []
  for grain in (float(g) for g in args.grains.split(',')):
    run = {'grain': grain}
    root = out / (f'videocc3m_{args.width}x{args.height}_{args.duration_s:g}s_{args.clips}'
                  f'_grain{grain:g}')
    t = time.perf_counter()
    run['kbit_per_s'] = write_clips(root, args.clips, spec, grain)
    run['write_s'] = time.perf_counter() - t
    print(f'{args.clips} mp4s under {root} ({run["write_s"]:.0f} s), '
          f'{run["kbit_per_s"]:.0f} kbit/s', flush=True)
    data_dir = out / f'tfds_{root.name}_s{args.short_side}'
    jpeg_dir = out / f'jpeg_{root.name}_s{args.short_side}_q{args.jpeg_quality}'
    datasets = {'files': {'name': 'videocc3m', 'path': str(root)},
                'tfds': {'name': f'tfds:{TFDS_NAME}', 'data_dir': str(data_dir)},
                'jpeg': {'name': 'jpeg', 'path': str(jpeg_dir)}}
    if {'tfds', 'jpeg'} & set(sources):
      if not (data_dir / TFDS_NAME / 'skipped.json').exists():
        t = time.perf_counter()
        summary = materialize.materialize(
            ml_collections.ConfigDict({**datasets['files'], 'short_side': args.short_side,
                                       'progress': False}),
            ['train'], name=TFDS_NAME, data_dir=data_dir)
        run['materialize_s'] = time.perf_counter() - t
        print(f'materialized {summary} in {run["materialize_s"]:.0f} s under {data_dir}')
      run['mb_per_clip'] = {'tfds': dir_mb(data_dir / TFDS_NAME) / args.clips}
    if 'jpeg' in sources:
      write_jpeg_store(data_dir, jpeg_dir, args.jpeg_quality)
      run['mb_per_clip']['jpeg'] = dir_mb(jpeg_dir) / args.clips
    print(f'stores, MB per clip: {run.get("mb_per_clip")} ({frame_mb:.0f} MB of uint8 '
          'frames uncompressed)', flush=True)
    for name in sources:
      print(f'timing {name} on core {args.core} (load average {os.getloadavg()}) ...',
            flush=True)
      run[name] = run_child(datasets[name], args)
      print(json.dumps(run[name]), flush=True)
    runs.append(run)
  report(args, runs, sources)


def report(args, runs: list[dict], sources: list[str]) -> None:
  bound = step_bound(args)
  per_chip = bound['global_batch'] / bound['chips']
  steps = {'bound': bound['step_time_lower_bound_s']}
  if bound.get('compute_bound_s'):
    steps['compute'] = bound['compute_bound_s']
  vcpus = min(V5E_VCPUS_PER_CHIP.values())
  print()
  print(f'Step bound: {bound["step_time_lower_bound_s"]:.3g} s for {bound["global_batch"]} '
        f'clips on {bound["topology"]} ({bound["chips"]} chips) = {per_chip:g} clips per chip '
        f'per step -> {per_chip / steps["bound"]:.2f} clips/s per chip'
        + (f'; its compute part alone, {steps["compute"]:.3g} s -> '
           f'{per_chip / steps["compute"]:.1f} clips/s per chip' if 'compute' in steps else '')
        + f'. Source: {bound["source"]}.')
  print('Published v5e vCPUs per chip: '
        + '; '.join(f'{k}: {v:g}' for k, v in V5E_VCPUS_PER_CHIP.items()))
  print()
  cols = ' | '.join(f'cores/chip at {v:.3g} s' for v in steps.values())
  print(f'| clips | source | stage | clips/s per core (wall) | clips per CPU-s | CPU ms / clip '
        f'| {cols} | load avg (1 min) |')
  print('|---|---|---|---|---|---|' + '---|' * len(steps) + '---|')
  for run in runs:
    clips = (f'{args.width}x{args.height}, grain {run["grain"]:g}, '
             f'{run["kbit_per_s"]:.0f} kbit/s')
    mb = run.get('mb_per_clip', {})
    labels = {'files': 'mp4 files',
              'tfds': f'array_record ({args.short_side} px, {mb.get("tfds", 0):.0f} MB/clip)',
              'jpeg': (f'sketch: JPEG q{args.jpeg_quality} per frame ({args.short_side} px, '
                       f'{mb.get("jpeg", 0):.0f} MB/clip)')}
    for name in sources:
      r = run[name]
      for stage, label in (('read', 'read only'), ('full', 'train example')):
        x = r[stage]
        cores = ' | '.join(f'{per_chip / v / x["clips_per_cpu_s"]:.1f}' for v in steps.values())
        print(f'| {clips} | {labels[name]} | {label} | {x["clips_per_s"]:.2f} | '
              f'{x["clips_per_cpu_s"]:.2f} | {x["cpu_ms_per_clip"]:.0f} | {cores} | '
              f'{r["load"][0][0]:.2f} -> {r["load"][1][0]:.2f} |')
  print()
  for run in runs:
    for name in sources:
      rate = run[name]['full']['clips_per_cpu_s']
      # The step time at which this source would need every vCPU of the chip.
      break_even = per_chip / (vcpus * rate)
      parts = []
      for what, v in steps.items():
        cores = per_chip / v / rate
        parts.append(f'{cores:.1f} cores per chip at the {v:.3g} s {what} step '
                     f'({100 * cores / vcpus:.0f} % of {vcpus:g} vCPUs: '
                     f'{"keeps up" if cores <= vcpus else "does NOT keep up"})')
      print(f'grain {run["grain"]:g}, {name}: ' + '; '.join(parts)
            + f'; needs all {vcpus:g} at a {1e3 * break_even:.0f} ms step.')
  (out_json := pathlib.Path(args.out) / f'results_grains{args.grains.replace(",", "_")}.json'
   ).write_text(json.dumps({'args': vars(args), 'bound': bound, 'runs': runs}, indent=1,
                           default=str))
  print(f'wrote {out_json}')


if __name__ == '__main__':
  main()

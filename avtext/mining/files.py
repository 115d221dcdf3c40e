"""The mining pipeline's files: seeds.tsv, the video tree, seed images and staged results,
on local disk or any filesystem Beam knows (gs://, s3://, hdfs://...).

Layouts: `avtext.mining.pipeline`'s docstring.
"""
from __future__ import annotations

import pathlib

import numpy as np

VIDEO_EXTENSIONS = ('.mp4', '.mkv', '.webm', '.avi', '.mov', '.m4v')


def is_remote(path: str) -> bool:
  """gs://, s3://, hdfs://... paths go through Beam's FileSystems; local ones do too."""
  return '://' in str(path)


def join(root: str, rel: str) -> str:
  return f"{str(root).rstrip('/')}/{rel}" if is_remote(root) else str(pathlib.Path(root) / rel)


def list_videos(root: str | pathlib.Path) -> list[tuple[str, str]]:
  """[(video id, path)] of every file with a video extension under root, sorted."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  root = str(root)
  if not is_remote(root) and not pathlib.Path(root).is_dir():
    raise FileNotFoundError(f'--videos {root}: not a directory')
  if is_remote(root):
    base = root.rstrip('/') + '/'
    found = sorted(m.path for r in FileSystems.match([base + '**']) for m in r.metadata_list)
    pairs = [(path[len(base):], path) for path in found if path.startswith(base)]
  else:
    pairs = [(p.relative_to(root).as_posix(), str(p))
             for p in sorted(pathlib.Path(root).rglob('*')) if p.is_file()]
  out = []
  for rel, path in pairs:
    suffix = pathlib.PurePosixPath(rel).suffix
    if suffix.lower() in VIDEO_EXTENSIONS:
      out.append((rel[:-len(suffix)], path))
  ids = [i for i, _ in out]
  if len(set(ids)) != len(ids):
    dup = sorted({i for i in ids if ids.count(i) > 1})
    raise ValueError(f'--videos {root}: two files share the id(s) {dup[:5]} (same path '
                     'but for the extension); keep one')
  return out


def read_bytes(path: str) -> bytes:
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  with FileSystems.open(path) as f:
    return f.read()


def write_bytes(path: str, data: bytes) -> None:
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  with FileSystems.create(path) as f:
    f.write(data)


def match(pattern: str) -> list[str]:
  """Paths matching a glob, local or remote, sorted."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  return sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)


def delete_tree(root: str) -> None:
  """Delete every file under root (the run's staging files), then root itself if local."""
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  found = match(f"{str(root).rstrip('/')}/**") if is_remote(root) else [
      str(p) for p in pathlib.Path(root).rglob('*') if p.is_file()]
  if found:
    FileSystems.delete(found)
  if not is_remote(root):
    for d in sorted(pathlib.Path(root).rglob('*'), reverse=True) + [pathlib.Path(root)]:
      if d.is_dir():
        d.rmdir()


def read_seeds(path: str | pathlib.Path) -> list[tuple[str, str, str]]:
  """[(seed id, image path, caption)] from seeds.tsv (module docstring)."""
  path = str(path)
  parent = path.rsplit('/', 1)[0] if '/' in path else '.'
  rows = []
  for n, line in enumerate(read_bytes(path).decode().splitlines(), 1):
    if not line.strip():
      continue
    parts = line.split('\t')
    if len(parts) != 3 or not all(parts):
      raise ValueError(f'{path}:{n}: expected "seed_id<TAB>image path<TAB>caption", got '
                       f'{line[:80]!r}')
    sid, img, caption = parts
    absolute = is_remote(img) or pathlib.Path(img).is_absolute()
    rows.append((sid, img if absolute else join(parent, img), caption))
  ids = [r[0] for r in rows]
  if len(set(ids)) != len(ids):
    raise ValueError(f'{path}: seed ids must be unique')
  if not rows:
    raise ValueError(f'{path}: no seeds')
  return rows


def load_image(path: str, size: tuple[int, int] | None) -> np.ndarray:
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    im = Image.open(io.BytesIO(read_bytes(path)))
  except (OSError, ValueError) as e:
    raise ValueError(f'seed image {path}: cannot be read ({e})') from e
  with im:
    im = im.convert('RGB')
    if size is not None and im.size != (size[1], size[0]):
      im = im.resize((size[1], size[0]), Image.BILINEAR)
    return np.asarray(im, np.uint8)

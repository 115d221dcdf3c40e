"""The mining pipeline's files: seeds.tsv, the video tree, seed images and staged results,
on local disk or any filesystem Beam knows (gs://, s3://, hdfs://...).

Layouts: `avtext.mining.pipeline`'s docstring.
"""
from __future__ import annotations

import contextlib
import pathlib
import re
import shutil

import numpy as np

from avtext import errors

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
    raise errors.InputNotFound(f'--videos={root}: no such directory; give the folder that '
                               'holds the corpus videos')
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
    raise errors.BadInput(f'--videos={root}: two files share the id(s) {dup[:5]} (same path '
                          'but for the extension); keep one of each')
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


def delete_tree(root: str, *, missing_ok: bool = False) -> None:
  """Delete every file under root (the run's staging files), then root itself if local,
  and its parent too when that is left empty (OUT/_beam). `missing_ok`: a run stopped
  early, whose workers may still add or remove files: whatever is there goes."""
  if missing_ok and not is_remote(root):
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
      pathlib.Path(root).parent.rmdir()
    return
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  found = match(f"{str(root).rstrip('/')}/**") if is_remote(root) else [
      str(p) for p in pathlib.Path(root).rglob('*') if p.is_file()]
  if found:
    FileSystems.delete(found)
  if not is_remote(root):
    for d in sorted(pathlib.Path(root).rglob('*'), reverse=True) + [pathlib.Path(root)]:
      if d.is_dir():
        d.rmdir()
    with contextlib.suppress(OSError):
      pathlib.Path(root).parent.rmdir()


# First fields of a header line that names the columns instead of holding a seed.
_HEADER_WORDS = {'seed_id', 'seed', 'id', 'image', 'image_path', 'path', 'url', 'file',
                 'caption', 'text', 'description'}


def read_seeds(path: str | pathlib.Path) -> list[tuple[str, str, str]]:
  """[(seed id, image path, caption)] from seeds.tsv (module docstring); a file of another
  structure (a line without 3 non-empty tab-separated columns, a header line, a seed id
  given twice, no seed) is `errors.BadInput` naming the line and the fix."""
  path = str(path)
  parent = path.rsplit('/', 1)[0] if '/' in path else '.'
  where = f'--seeds={path}'
  try:
    text = read_bytes(path).decode()
  except UnicodeDecodeError as e:
    raise errors.BadInput(f'{where}: not UTF-8 text ({e.reason} at byte {e.start}); give a '
                          'tab-separated text file: seed_id<TAB>image path<TAB>caption') from None
  rows, line_of = [], {}
  for n, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    parts = line.split('\t')
    if len(parts) != 3 or not all(p.strip() for p in parts):
      got = f'{len(parts)} column(s)' if len(parts) != 3 else 'an empty column'
      raise errors.BadInput(f'{where}:{n}: {got} in {line[:60]!r}; each line must be '
                            'seed_id<TAB>image path<TAB>caption (3 tab-separated columns)')
    sid, img, caption = parts
    if not rows and {sid.strip().lower(), img.strip().lower()} & _HEADER_WORDS:
      raise errors.BadInput(f'{where}:{n}: {line[:60]!r} looks like a header row; remove it '
                            '(seeds.tsv has no header: seed_id<TAB>image path<TAB>caption)')
    if sid in line_of:
      raise errors.BadInput(f'{where}:{n}: seed id {sid!r} is also on line {line_of[sid]}; '
                            'seed ids must be unique: rename or drop one of them')
    line_of[sid] = n
    absolute = is_remote(img) or pathlib.Path(img).is_absolute()
    rows.append((sid, img if absolute else join(parent, img), caption))
  if not rows:
    raise errors.BadInput(f'{where}: no seeds in it; each line must be '
                          'seed_id<TAB>image path<TAB>caption')
  return rows


class ImageReadError(ValueError):
  """A seed image that is missing ('missing') or does not decode ('unreadable')."""

  def __init__(self, path: str, reason: str, detail: str):
    super().__init__(f'seed image {path}: {reason} ({detail})')
    self.path, self.reason, self.detail = path, reason, detail


def load_image(path: str, size: tuple[int, int] | None) -> np.ndarray:
  """uint8 [H, W, 3] (resized to size=(H, W) when given); ImageReadError when it is
  missing or does not decode."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    data = read_bytes(path)
  except (OSError, IOError) as e:  # Beam's BeamIOError is an IOError
    raise ImageReadError(path, 'missing', f'{type(e).__name__}: {e}'[:200]) from e
  try:
    im = Image.open(io.BytesIO(data))
    with im:
      im = im.convert('RGB')
      if size is not None and im.size != (size[1], size[0]):
        im = im.resize((size[1], size[0]), Image.BILINEAR)
      return np.asarray(im, np.uint8)
  except (OSError, ValueError, SyntaxError) as e:  # PIL's decoders raise all three
    # PIL names the in-memory buffer by its address: the same bytes in every run instead.
    detail = re.sub(r'<_io\.BytesIO object at 0x[0-9a-f]+>', 'the file', str(e))
    raise ImageReadError(path, 'unreadable', f'{type(e).__name__}: {detail}'[:200]) from e

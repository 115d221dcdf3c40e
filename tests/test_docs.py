"""The README and docs/ stay true: links resolve, named programs and make targets exist.

- README.md is a landing page of at most 200 lines.
- Every relative markdown link in README.md and docs/*.md points at a file of the
  repository, and an anchor (`file.md#heading`) at a heading of that file (GitHub's
  anchor rules).
- Every `python -m avtext.<module>` (or `benchmarks.<module>`) they mention is a module of
  this checkout (found with `importlib.machinery.PathFinder`, from the repository root,
  without importing anything), runnable with -m (a package needs a __main__), and every
  `python -m avtext.features <kind>` names a kind the program knows.
- Every `make <target>` they mention is a target of the Makefile.
- No file of the project (README, docs, BENCHMARKS.md, Makefile, avtext/, tests/,
  configs/, benchmarks/) uses the word the project does not use for itself
  (the banned word is built below, so this file does not contain it).
Pure file reading: well under 2 s.
"""
import ast
import importlib.machinery
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README] + DOCS
README_MAX_LINES = 200

def _rel(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT))


def _page_ids(page):
  return _rel(page)


# ---------------------------------------------------------------- markdown helpers

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")


def _prose_lines(text: str):
  """The lines outside fenced code blocks (links there are not links)."""
  inside = False
  for line in text.splitlines():
    if _FENCE.match(line.strip()):
      inside = not inside
      continue
    if not inside:
      yield line


def _code_text(text: str) -> str:
  """What the page shows as code: fenced blocks, indented blocks, inline spans."""
  parts, inside = [], False
  for line in text.splitlines():
    if _FENCE.match(line.strip()):
      inside = not inside
      continue
    if inside or line.startswith("    "):
      parts.append(line)
    else:
      parts.extend(re.findall(r"`([^`]+)`", line))
  return "\n".join(parts)


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: the text without markup, lower case, punctuation
  other than - and _ dropped, spaces to hyphens."""
  text = re.sub(r"`([^`]*)`", r"\1", heading)
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
  text = re.sub(r"[*_]{2}([^*_]+)[*_]{2}", r"\1", text)  # bold
  text = text.strip().lower()
  text = "".join(c for c in text if c.isalnum() or c in " -_")
  return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for line in _prose_lines(page.read_text()):
    m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not m:
      continue
    slug = _slug(m.group(1))
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def _links(page: pathlib.Path):
  for line in _prose_lines(page.read_text()):
    for target in _LINK.findall(line) + _IMAGE.findall(line):
      yield target


# ---------------------------------------------------------------- the tests

def test_readme_is_a_landing_page():
  lines = README.read_text().splitlines()
  assert len(lines) <= README_MAX_LINES, (
      f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move details to docs/")


def test_docs_pages_exist():
  names = {p.name for p in DOCS}
  for name in ("videocc.md", "smit.md", "coot.md", "tvr.md", "own_videos.md",
               "architecture.md", "scale.md"):
    assert name in names, f"docs/{name} is missing"


@pytest.mark.parametrize("page", PAGES, ids=_page_ids)
def test_relative_links_resolve(page):
  bad = []
  for target in _links(page):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if path and not dest.is_relative_to(ROOT):
      bad.append(f"{target}: outside the repository")
      continue
    if not dest.exists():
      bad.append(f"{target}: no such file")
      continue
    if anchor:
      if dest.suffix != ".md":
        bad.append(f"{target}: an anchor into a file that is not markdown")
      elif anchor not in _anchors(dest):
        bad.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
  assert not bad, f"{_rel(page)}: broken links:\n  " + "\n  ".join(bad)


def _module_spec(name: str):
  """The spec of avtext module `name` in this checkout, found without importing."""
  parts = name.split(".")
  path = [str(ROOT)]
  spec = None
  for i, part in enumerate(parts):
    spec = importlib.machinery.PathFinder.find_spec(part, path)
    if spec is None:
      return None
    if i < len(parts) - 1:
      if not spec.submodule_search_locations:
        return None
      path = list(spec.submodule_search_locations)
  return spec


def _runnable(name: str) -> bool:
  spec = _module_spec(name)
  if spec is None:
    return False
  if spec.submodule_search_locations:  # a package: -m runs its __main__
    return _module_spec(f"{name}.__main__") is not None
  return True


def _feature_kinds() -> set[str]:
  tree = ast.parse((ROOT / "avtext" / "features" / "__main__.py").read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "KINDS" for t in node.targets):
      return set(ast.literal_eval(node.value))
  raise AssertionError("avtext/features/__main__.py defines no KINDS")


_PYTHON_M = re.compile(r"python\s+-m\s+((?:avtext|benchmarks)(?:\.\w+)*)(\.<)?")
_FEATURES = re.compile(r"python\s+-m\s+avtext\.features\s+([\w|<>]+)")


@pytest.mark.parametrize("page", PAGES, ids=_page_ids)
def test_programs_exist(page):
  text = page.read_text()
  bad = []
  for name, placeholder in _PYTHON_M.findall(text):
    if placeholder:  # `python -m avtext.tools.<tool>`: the package must exist
      if _module_spec(name) is None:
        bad.append(f"{name} (no such package)")
    elif not _runnable(name):
      bad.append(f"python -m {name}")
  kinds = _feature_kinds()
  for spec in _FEATURES.findall(text):
    for kind in spec.split("|"):
      if kind and not kind.startswith("<") and kind not in kinds:
        bad.append(f"python -m avtext.features {kind} (kinds: {', '.join(sorted(kinds))})")
  assert not bad, f"{_rel(page)} names programs that do not exist:\n  " + "\n  ".join(
      sorted(set(bad)))


def _make_targets() -> set[str]:
  targets = set()
  for line in (ROOT / "Makefile").read_text().splitlines():
    m = re.match(r"^([^\s:=#][^:=]*?)\s*:(?!=)", line)
    if m:
      targets.update(m.group(1).split())
    if line.startswith(".PHONY:"):
      targets.update(line.split(":", 1)[1].split())
  return targets


@pytest.mark.parametrize("page", PAGES, ids=_page_ids)
def test_make_targets_exist(page):
  targets = _make_targets()
  named = re.findall(r"(?:^|[\s;&|(`])make\s+(?:-\S+\s+)*([a-z][\w-]*)(?=[\s`)|;]|$)",
                     _code_text(page.read_text()), flags=re.M)
  missing = sorted({t for t in named if t not in targets})
  assert not missing, f"{_rel(page)} names make targets the Makefile lacks: {missing}"


# Built from two halves so that this file does not contain the word it looks for.
_BANNED = re.compile("ses" "sion", re.IGNORECASE)
_PROJECT_FILES = ("README.md", "BENCHMARKS.md", "Makefile")
_PROJECT_DIRS = ("docs", "avtext", "tests", "configs", "benchmarks")
_BINARY = {".png", ".jpg", ".jpeg", ".gif", ".npz", ".npy", ".h5", ".hdf5", ".pyc", ".mp4",
           ".wav", ".mkv", ".faiss", ".pt", ".safetensors", ".array_record"}


def _project_files():
  for name in _PROJECT_FILES:
    yield ROOT / name
  for folder in _PROJECT_DIRS:
    for path in sorted((ROOT / folder).rglob("*")):
      if (path.is_file() and "__pycache__" not in path.parts
          and path.suffix.lower() not in _BINARY):
        yield path


def test_the_project_speaks_of_the_project():
  hits = []
  for path in _project_files():
    try:
      text = path.read_text()
    except (UnicodeDecodeError, FileNotFoundError):
      continue
    for i, line in enumerate(text.splitlines(), 1):
      if _BANNED.search(line):
        hits.append(f"{_rel(path)}:{i}: {line.strip()[:100]}")
  assert not hits, ("say 'the project' / 'a run' / 'a step', not the banned word:\n  "
                    + "\n  ".join(hits))

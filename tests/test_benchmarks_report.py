"""The benchmark suite's rules: BENCHMARKS.md and README.md's demo table are what `make
report` writes from the results store (benchmarks/results.jsonl); every row has its command;
the store only grows (rows appended or deleted, never edited, in every commit since the
rule's and in the working tree: git); the report is short and current; every benchmark script is an absl program that imports
only `avtext` and `benchmarks.common` and never edits sys.path. Pure file reading and ast:
well under a second.
"""
import ast
import importlib.machinery
import json
import pathlib
import re
import subprocess
import warnings

import pytest

from benchmarks import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROWS = report.read_rows()
NOTES = report.read_notes()
GENRES = ("speed", "tables", "analyses")
SCRIPTS = sorted(p for genre in GENRES for p in (ROOT / "benchmarks" / genre).glob("*.py")
                 if p.name != "__init__.py")
# 950: the per-kernel model's H100 check and the levers table came in; the H100 AOT-bound
# table and the CPU bf16-step alternation they supersede went out. 955: the web page's load
# test (avtext.serve, 8 clients on a 1,000-video index) came in. 970: the preemption table
# (the stop agreement's cost, signal to exit, the multi-process CPU compile) came in.
REPORT_MAX_LINES = 970


def _rel(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT))


# ---------------------------------------------------------------- the store and the report

def test_benchmarks_md_is_what_make_report_writes():
  assert (ROOT / "BENCHMARKS.md").read_text() == report.render(ROWS, NOTES), (
      "BENCHMARKS.md differs from the results store: run `make report` (and edit "
      "benchmarks/results.jsonl or benchmarks/notes.md, never BENCHMARKS.md)")


def test_readme_demo_table_is_what_make_report_writes():
  readme = (ROOT / "README.md").read_text()
  assert report.with_readme_table(readme, report.readme_table(ROWS, NOTES)) == readme, (
      "README.md's demo table differs from the results store: run `make report`")


def _readme_rows() -> list[list[str]]:
  text = (ROOT / "README.md").read_text()
  block = text[text.index(report.README_BEGIN) + len(report.README_BEGIN):
               text.index(report.README_END)]
  rows = [[c.strip() for c in line.strip().strip("|").split(" | ")]
          for line in block.strip().splitlines()]
  return rows[2:]  # the header and its rule


def test_readme_demo_numbers_are_the_stores():
  number = re.compile(r"\d+(?:\.\d+)?")
  latest = report.latest(ROWS)
  targets = {f"`{n['target']}`": b for b, n in NOTES.items() if n.get("target")}
  rows = _readme_rows()
  assert rows, "README.md's demo table is empty"
  for command, _, time, headline in rows:
    assert command in targets, f"README demo {command}: no benchmark of notes.md has it as target"
    mine = [r for r in latest if r["benchmark"] == targets[command] and r.get("headline")]
    stored = set(number.findall(" ".join(report.item(r) for r in mine)))
    shown = set(number.findall(time + " " + headline))
    assert shown <= stored, (f"README demo {command}: {sorted(shown - stored)} are not the "
                             "store's numbers; run `make report`")


def test_every_row_is_complete_and_names_its_command():
  problems = [f"row {i + 1} ({r.get('benchmark')}: {r.get('metric')}): {p}"
              for i, r in enumerate(ROWS) for p in report.row_problems(r)]
  assert not problems, "\n".join(problems)


def test_a_row_without_its_command_or_with_a_machine_path_is_refused():
  row = dict(ROWS[0])
  assert not report.row_problems(row)
  assert "no command" in report.row_problems({**row, "command": ""})
  assert "no command" in report.row_problems({k: v for k, v in row.items() if k != "command"})
  assert any("path of the measuring machine" in p for p in report.row_problems(
      {**row, "command": "python -m benchmarks.speed.x --out=/tmp/bench"}))
  assert any("unknown key" in p for p in report.row_problems({**row, "note": "x"}))


def test_every_benchmark_has_a_title_and_every_demo_its_make_target():
  makefile = (ROOT / "Makefile").read_text()
  bad = []
  for benchmark in dict.fromkeys(r["benchmark"] for r in ROWS):
    note = NOTES.get(benchmark, {})
    if not note.get("title"):
      bad.append(f"{benchmark}: no `## {benchmark}` with a title in benchmarks/notes.md")
    if benchmark.startswith("demo."):
      target = note.get("target", "").removeprefix("make ")
      if not note.get("shows") or not re.search(rf"^{re.escape(target)}:", makefile, re.M):
        bad.append(f"{benchmark}: needs `target: make <a Makefile target>` and `shows:`")
  assert not bad, "\n".join(bad)


# The store's last commit before its history was checked: every later version only adds
# and deletes rows (earlier commits edited some in place).
APPEND_ONLY_SINCE = "25faab4"


def _row(value, commit="aaaaaaa", metric="m"):
  return json.dumps({"benchmark": "b", "system": "s", "metric": metric, "value": value,
                     "command": "c", "commit": commit, "machine": "x", "date": "2026-11-28"})


def test_store_edits_allows_appends_and_deletions_only():
  old = [_row(1, metric="a"), _row(2, metric="b"), _row(3, metric="c")]
  assert report.store_edits(old, old + [_row(4, metric="d")]) == []
  assert report.store_edits(old, [old[0], old[2]]) == []  # a superseded row deleted
  # The same key measured again (another commit) after the old row is deleted: fine.
  assert report.store_edits(old, old[:2] + [_row(5, commit="bbbbbbb", metric="c")]) == []
  edited = [old[0], _row(7, metric="b"), old[2]]
  assert "edited in place" in report.store_edits(old, edited)[0]
  assert "appended again" in report.store_edits(old, old[:2] + [_row(9, metric="c")])[0]
  assert report.store_edits(old, [old[1], old[0], old[2]]) == ["existing rows reordered"]


def _git(*args: str) -> str:
  return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                        check=True).stdout


def test_the_store_only_grows_since_the_rule():
  try:
    _git("cat-file", "-e", f"{APPEND_ONLY_SINCE}^{{commit}}")
    commits = _git("rev-list", "--reverse", f"{APPEND_ONLY_SINCE}..HEAD", "--",
                   "benchmarks/results.jsonl").split()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip(f"needs the git history from {APPEND_ONLY_SINCE} (not a shallow clone)")
  store = _rel(report.STORE)
  versions = [(c, _git("show", f"{c}:{store}").splitlines())
              for c in [APPEND_ONLY_SINCE, *commits]]
  versions.append(("the working tree", report.STORE.read_text().splitlines()))
  for (_, old), (name, new) in zip(versions, versions[1:]):
    problems = report.store_edits(old, new)
    assert not problems, (f"{name} edits {store} ({len(problems)} problems; rows are "
                          f"appended, or deleted, never changed): {problems[:3]}")


def test_the_report_is_short_and_current():
  text = (ROOT / "BENCHMARKS.md").read_text()
  if (n := len(text.splitlines())) > REPORT_MAX_LINES:  # a reading size: a warning
    warnings.warn(f"BENCHMARKS.md: {n} lines, {n - REPORT_MAX_LINES} over {REPORT_MAX_LINES}: "
                  "drop or fold rows that no longer say something a reader needs")
  history = sorted(set(re.findall(r"\b(?:was|were|old)\b", text, re.I)))
  assert not history, f"history prose in BENCHMARKS.md ({history}): say what is, git keeps the rest"
  hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", text)
  assert not hashes, f"commit hashes in BENCHMARKS.md: {hashes}"
  paths = report.MACHINE_PATH.findall(text)
  assert not paths, f"paths of the measuring machine in BENCHMARKS.md: {paths}"


def _module_spec(name: str):
  path, spec = [str(ROOT)], None
  for i, part in enumerate(name.split(".")):
    spec = importlib.machinery.PathFinder.find_spec(part, path)
    if spec is None or (i < name.count(".") and not spec.submodule_search_locations):
      return None
    path = list(spec.submodule_search_locations or [])
  return spec


def test_the_stores_commands_run_programs_that_exist():
  programs = {m for r in ROWS for m in re.findall(r"python -m ((?:benchmarks|avtext|avworld)(?:\.\w+)+)",
                                                  r["command"])}
  missing = sorted(p for p in programs if _module_spec(p) is None)
  assert not missing, f"commands in benchmarks/results.jsonl name no module: {missing}"


# ---------------------------------------------------------------- the scripts

def script_problems(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
  """Why `path` is not a benchmark script as benchmarks/common/__init__.py describes one:
  a project import other than avtext and benchmarks.common (a sibling module by its bare
  name included), a sys.path edit, argparse, no `python -m` command in its docstring, no
  `common.main(main)`."""
  tree = ast.parse(path.read_text(), str(path))
  siblings = {p.stem for p in (root / "benchmarks").rglob("*.py")} | {
      p.stem for p in (root / "configs").glob("*.py")}
  bad = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        bad.append(f"line {node.lineno}: a relative import")
        continue
      base = node.module or ""
      names = [f"{base}.{a.name}" if base == "benchmarks" else base for a in node.names]
    else:
      if (isinstance(node, ast.Attribute) and node.attr == "path"
          and isinstance(node.value, ast.Name) and node.value.id == "sys"):
        bad.append(f"line {node.lineno}: sys.path (make external code importable with "
                   "common.import_checkout)")
      continue
    for name in names:
      top = name.split(".")[0]
      if top == "argparse":
        bad.append(f"line {node.lineno}: argparse (scripts are absl programs)")
      elif top == "benchmarks" and not (name == "benchmarks.common"
                                        or name.startswith("benchmarks.common.")):
        bad.append(f"line {node.lineno}: imports {name} (only avtext and benchmarks.common)")
      elif top in ("configs", "tests") or (top in siblings and top != "benchmarks"):
        bad.append(f"line {node.lineno}: imports {name} (only avtext and benchmarks.common)")
  module = ".".join(path.relative_to(root).with_suffix("").parts)
  if f"python -m {module}" not in (ast.get_docstring(tree) or ""):
    bad.append(f"its docstring does not give its command `python -m {module}`")
  if "common.main(main)" not in path.read_text():
    bad.append("does not end in `common.main(main)` (the shared flags, absl's app.run)")
  return bad


def test_the_benchmarks_are_grouped_by_genre():
  loose = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if p.name not in ("__init__.py", "report.py"))
  assert not loose, f"benchmarks/ holds scripts outside {GENRES}: {loose}"
  assert len(SCRIPTS) >= 25


@pytest.mark.parametrize("path", SCRIPTS, ids=_rel)
def test_a_script_imports_only_avtext_and_common_and_never_edits_sys_path(path):
  problems = script_problems(path)
  assert not problems, f"{_rel(path)}:\n  " + "\n  ".join(problems)


def test_the_rule_catches_a_planted_script(tmp_path):
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "videocc_avr.py").write_text("")
  (tmp_path / "benchmarks" / "speed").mkdir(parents=True)
  (tmp_path / "benchmarks" / "speed" / "side_by_side.py").write_text("")
  planted = tmp_path / "benchmarks" / "speed" / "planted.py"
  planted.write_text('"""A planted script."""\nimport argparse\nimport sys\n'
                     'sys.path.insert(0, "benchmarks")\nfrom benchmarks.speed import generate\n'
                     'import side_by_side\nfrom configs import videocc_avr\n'
                     'from benchmarks import report\nfrom . import x\n')
  problems = "\n".join(script_problems(planted, tmp_path))
  for expected in ("argparse", "sys.path", "benchmarks.speed", "side_by_side", "configs",
                   "benchmarks.report", "relative import", "docstring", "common.main"):
    assert expected in problems, (expected, problems)
  fine = tmp_path / "benchmarks" / "speed" / "fine.py"
  fine.write_text('"""python -m benchmarks.speed.fine"""\nfrom absl import flags\n'
                  'import numpy as np\nfrom avtext import runs\nfrom benchmarks import common\n'
                  'from benchmarks.common import official\n'
                  'if __name__ == "__main__":\n  common.main(main)\n')
  assert not script_problems(fine, tmp_path)

r"""BENCHMARKS.md and README.md's demo table, written from the results store.

    python -m benchmarks.report            # `make report`: writes both files
    python -m benchmarks.report --check    # exit status 1 if either differs from the store

The store, benchmarks/results.jsonl, holds one JSON object a line per measured number
(`FIELDS`), appended by the benchmark scripts (`benchmarks.common.record`) and never
edited in place (a superseded row may be deleted; `store_edits`, which the tests run on
every commit's change of the store): the last row of each (benchmark, table, metric,
column) is the current number, earlier ones are history. benchmarks/notes.md gives each benchmark its title and
one paragraph on what its numbers say. BENCHMARKS.md is a headline table (one row per
system: the rows marked `headline`), then a section per system with each benchmark's
tables and the command, date and machine of every number. Standard library only: a fresh
clone writes the report without a virtual environment.
"""
import collections
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORE = ROOT / "benchmarks" / "results.jsonl"
NOTES = ROOT / "benchmarks" / "notes.md"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
README = ROOT / "README.md"

# A row's keys, in the order they are written. `value` is a number (or a short text where
# the outcome is not one, e.g. "out of memory"); `std` its spread; `peer` the number it is
# held against (a baseline, the oracle, the paper, the official code), named by
# `peer_name`; `column` makes the benchmark's `table` two-dimensional (rows are metrics);
# `headline` puts the number in the headline table's quality, speed or demo cell (a headline
# row without a `table` sums up a benchmark's tables: its section names it in one line).
FIELDS = ("benchmark", "system", "table", "metric", "column", "value", "std", "unit", "peer",
          "peer_name", "headline", "command", "commit", "machine", "date")
REQUIRED = ("benchmark", "system", "metric", "value", "command", "machine", "date")
HEADLINES = ("quality", "speed", "demo")
# The systems, in the report's order: one headline row and one section each.
SYSTEMS = ("VideoCC AVR", "Demo stage 1 (RGB tower)", "Input pipeline", "VideoCC captioning",
           "VideoCC mining", "S-MiT", "COOT", "TVR: XML", "TVR: MMT", "Official parity",
           "Paper configs at scale", "Own videos", "Library functions", "Test suite")
# Paths of the machine that measured a number have no place in its command.
MACHINE_PATH = re.compile(r"(?<![\w.$<])/(?:work|tmp|home|root|Users|mnt|scratch)/")

# Modules that moved since rows were measured: a row keeps the command as it was run, and
# the report shows it under the module's name today.
MOVED = {**{f"avtext.tools.{t}": f"avworld.tools.{t}" for t in (
    "coot_synthetic", "mining_world", "smit_asr", "synthetic_layout", "tvr_synthetic")},
         "avtext.data.synthetic": "avworld"}
_MOVED = re.compile(r"\b(" + "|".join(re.escape(m) for m in MOVED) + r")\b")

README_BEGIN = "<!-- demo table: written by `make report` from benchmarks/results.jsonl -->"
README_END = "<!-- end of the demo table -->"


# ---------------------------------------------------------------- reading

def read_rows(path: pathlib.Path = STORE) -> list[dict]:
  """The store's rows, their commands naming today's modules (`MOVED`)."""
  rows = []
  for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
    if line.strip():
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON: {e}") from e
      if isinstance(rows[-1].get("command"), str):
        rows[-1]["command"] = _MOVED.sub(lambda m: MOVED[m.group(1)], rows[-1]["command"])
  return rows


def row_problems(row: dict) -> list[str]:
  """What is wrong with one row of the store (empty: nothing)."""
  bad = [f"unknown key {k!r}" for k in row if k not in FIELDS]
  bad += [f"no {k}" for k in REQUIRED if row.get(k) in (None, "")]
  if row.get("system") not in SYSTEMS:
    bad.append(f"system {row.get('system')!r} is not one of report.SYSTEMS")
  if row.get("headline") not in (None,) + HEADLINES:
    bad.append(f"headline {row.get('headline')!r}: expected one of {HEADLINES}")
  if not re.fullmatch(r"\d{4}-\d\d-\d\d", str(row.get("date", ""))):
    bad.append(f"date {row.get('date')!r}: expected YYYY-MM-DD")
  if MACHINE_PATH.search(str(row.get("command", ""))):
    bad.append("the command holds a path of the measuring machine (use a placeholder)")
  if not isinstance(row.get("value"), (int, float, str)) or isinstance(row.get("value"), bool):
    bad.append(f"value {row.get('value')!r}: a number or a short text")
  return bad


def key(row: dict) -> tuple:
  return (row["benchmark"], row.get("table", ""), row["metric"], row.get("column"))


def latest(rows: list[dict]) -> list[dict]:
  """The last row of each key, in the order the keys first appear."""
  last = {}
  for row in rows:
    last[key(row)] = row  # a dict keeps a key at its first place; the value is the last
  return list(last.values())


def store_edits(old: list[str], new: list[str]) -> list[str]:
  """What a change of the store from lines `old` to lines `new` did other than append rows
  at the end and delete rows (a superseded key, a retired benchmark): a row edited in
  place, a row inserted before kept ones, or a deleted row put back with the same
  provenance (key, command, commit, date) and another value. One line per problem."""
  old_set = set(old)
  fresh = [i for i, line in enumerate(new) if line.strip() and line not in old_set]
  last_kept = max((i for i, line in enumerate(new) if line in old_set), default=-1)
  problems = [f"line {i + 1}: a row inserted before the store's existing rows (or one "
              f"edited in place): {new[i][:160]}" for i in fresh if i < last_kept]
  kept = [line for line in new if line in old_set]
  kept_set, new_set = set(kept), set(new)
  if kept != [line for line in old if line in kept_set]:
    problems.append("existing rows reordered")

  def provenance(line):
    row = json.loads(line)
    return (key(row), row.get("command"), row.get("commit"), row.get("date"))
  deleted = {provenance(line): line for line in old if line.strip() and line not in new_set}
  for i in fresh:
    if i > last_kept and provenance(new[i]) in deleted:
      problems.append(f"line {i + 1}: a deleted row appended again with its provenance and "
                      f"other fields (an edit): {new[i][:160]}")
  return problems


def read_notes(path: pathlib.Path = NOTES) -> dict[str, dict]:
  """{section id: {"title", "target", "shows", ..., "text"}} of notes.md: `## <id>`, then
  `field: value` lines, then the paragraph (up to the next `## `)."""
  notes, current = {}, None
  for line in pathlib.Path(path).read_text().splitlines():
    if line.startswith("## "):
      current = notes.setdefault(line[3:].strip(), {"text": []})
      continue
    if current is None:
      continue
    field = re.match(r"^(title|target|shows): (.*)$", line)
    if field and not current["text"]:
      current[field.group(1)] = field.group(2).strip()
    else:
      current["text"].append(line)
  for note in notes.values():
    note["text"] = "\n".join(note["text"]).strip()
  return notes


# ---------------------------------------------------------------- formatting

def number(value) -> str:
  """A float's shortest exact form (16.1, 0.531, 1.43e-06; 37.0 keeps its decimal), an int
  as it is."""
  if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
    return f"{value:.1f}"
  return repr(value) if isinstance(value, float) else str(value)


def with_unit(value, unit: str = "", std=None) -> str:
  if unit == "min s" and isinstance(value, (int, float)):
    minutes, seconds = divmod(int(round(value)), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"
  text = number(value) + (f" ± {number(std)}" if std is not None else "")
  if not unit or (isinstance(value, str) and not value[:1].isdigit()):
    return text  # a text outcome ("out of memory") takes no unit; "4.53-4.69" does
  return text + unit if unit == "x" else f"{text} {unit}"


def cell(text: str) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def item(row: dict) -> str:
  """"metric: value unit (peer_name peer)": a number as the headline and README say it."""
  text = f"{row['metric']}: {with_unit(row['value'], row.get('unit', ''), row.get('std'))}"
  if row.get("peer") is not None:
    text += f" ({row.get('peer_name') or 'against'} {with_unit(row['peer'], row.get('unit', ''))})"
  return text


def measured(row: dict) -> str:
  return f"{row['date']}, {row['machine']}"


# ---------------------------------------------------------------- BENCHMARKS.md

def _table(rows: list[dict]) -> list[str]:
  """One table of a benchmark: a line naming it with its command, date and machine (or
  numbered commands and lettered dates / machines the rows refer to), then the table."""
  commands = list(dict.fromkeys(r["command"] for r in rows))
  whens = list(dict.fromkeys(measured(r) for r in rows))
  lead = f"**{rows[0]['table']}**" if rows[0].get("table") else "Measured"
  lead += f" ({whens[0]})" if len(whens) == 1 else ""
  out = [f"{lead}: `{commands[0]}`" if len(commands) == 1 else f"{lead}:"]
  if len(commands) > 1:
    out += [f"{i}. `{c}`" for i, c in enumerate(commands, 1)]
  if len(whens) > 1:
    out += [f"{'; ' if i else ''}({chr(97 + i)}) {w}" for i, w in enumerate(whens)]
    out[-len(whens):] = ["Measured " + "".join(out[-len(whens):]) + "."]
  out.append("")

  def refs(cells: list[dict]) -> list[str]:
    extra = []
    if len(commands) > 1:
      extra.append(", ".join(str(commands.index(c) + 1)
                             for c in dict.fromkeys(r["command"] for r in cells)))
    if len(whens) > 1:
      extra.append(", ".join(chr(97 + whens.index(w))
                             for w in dict.fromkeys(measured(r) for r in cells)))
    return extra

  extra_head = (["command"] if len(commands) > 1 else []) + (["measured"] if len(whens) > 1 else [])
  if len(rows) == 1 and not extra_head:  # one number: a line, not a table
    return out[:-1] + [f"{item(rows[0])}" + (f" ({rows[0]['column']})" if rows[0].get("column")
                                             else "") + ".", ""]
  if any(r.get("column") is not None for r in rows):
    columns = list(dict.fromkeys(r.get("column") or "value" for r in rows))
    by_metric = collections.defaultdict(dict)
    for r in rows:
      by_metric[r["metric"]][r.get("column") or "value"] = r
    out.append("| | " + " | ".join(cell(c) for c in columns + extra_head) + " |")
    out.append("|---" * (len(columns) + len(extra_head) + 1) + "|")
    for metric, cells in by_metric.items():
      values = [with_unit(cells[c]["value"], cells[c].get("unit", ""), cells[c].get("std"))
                if c in cells else "" for c in columns]
      out.append("| " + " | ".join(cell(v) for v in [metric] + values + refs(
          list(cells.values()))) + " |")
  else:
    peers = any(r.get("peer") is not None for r in rows)
    out.append("| | value |" + (" against |" if peers else "")
               + "".join(f" {h} |" for h in extra_head))
    out.append("|---|---|" + ("---|" if peers else "") + "---|" * len(extra_head))
    for r in rows:
      cells = [r["metric"], with_unit(r["value"], r.get("unit", ""), r.get("std"))]
      if peers:
        cells.append(f"{r.get('peer_name') or ''} {with_unit(r['peer'], r.get('unit', ''))}"
                     .strip() if r.get("peer") is not None else "")
      out.append("| " + " | ".join(cell(c) for c in cells + refs([r])) + " |")
  return out + [""]


def _section(benchmark: str, rows: list[dict], notes: dict) -> list[str]:
  note = notes.get(benchmark, {})
  out = [f"### {note.get('title', benchmark)}"]
  # Headline rows outside the tables are the headline table's (top of the report).
  summary = [r for r in rows if r.get("headline") and not r.get("table")]
  if note.get("text"):
    out += [note["text"], ""]
  tables = collections.defaultdict(list)
  for r in rows:
    if r not in summary:
      tables[r.get("table", "")].append(r)
  for table_rows in tables.values():
    out += _table(table_rows)
  return out


def headline(rows: list[dict]) -> list[str]:
  out = ["| system | quality (vs baseline / oracle / paper) | speed vs its peer "
         "| demo (time here) |", "|---|---|---|---|"]
  for system in SYSTEMS:
    mine = [r for r in rows if r["system"] == system]
    if not mine:
      continue
    cells = ["; ".join(item(r) for r in mine if r.get("headline") == h) or "-"
             for h in HEADLINES]
    out.append(f"| {system} | " + " | ".join(cell(c) for c in cells) + " |")
  return out


def render(rows: list[dict], notes: dict) -> str:
  rows = latest(rows)
  out = ["# Benchmarks", "",
         "<!-- Written by `make report` (python -m benchmarks.report) from "
         "benchmarks/results.jsonl",
         "     and benchmarks/notes.md: change those, then run it; do not edit this file. -->", ""]
  if notes.get("intro", {}).get("text"):
    out += [notes["intro"]["text"], ""]
  out += ["## Headline", ""] + headline(rows) + [""]
  for system in SYSTEMS:
    mine = [r for r in rows if r["system"] == system]
    if not mine:
      continue
    out += [f"## {system}", ""]
    if notes.get(system, {}).get("text"):
      out += [notes[system]["text"], ""]
    benchmarks = collections.defaultdict(list)
    for r in mine:
      benchmarks[r["benchmark"]].append(r)
    for benchmark, benchmark_rows in benchmarks.items():
      out += _section(benchmark, benchmark_rows, notes)
  return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------- README.md

def readme_table(rows: list[dict], notes: dict) -> str:
  """README's demo table: one line per `demo.*` benchmark, its time and headline numbers."""
  rows = latest(rows)
  out = ["| command | what it shows | time (2-core dev VM) | headline number (2-core dev VM) |",
         "|---|---|---|---|"]
  for benchmark in dict.fromkeys(r["benchmark"] for r in rows):
    if not benchmark.startswith("demo."):
      continue
    note = notes.get(benchmark, {})
    mine = [r for r in rows if r["benchmark"] == benchmark]
    time = "; ".join(with_unit(r["value"], r.get("unit", "")) for r in mine
                     if r.get("headline") == "demo")
    quality = "; ".join(item(r) for r in mine if r.get("headline") == "quality")
    out.append("| " + " | ".join(cell(c) for c in (
        f"`{note.get('target', benchmark)}`", note.get("shows", ""), time or "-",
        quality or "-")) + " |")
  return "\n".join(out)


def with_readme_table(readme: str, table: str) -> str:
  begin, end = readme.find(README_BEGIN), readme.find(README_END)
  if begin < 0 or end < begin:
    raise ValueError(f"README.md: no {README_BEGIN!r} ... {README_END!r} block")
  return readme[:begin + len(README_BEGIN)] + "\n" + table + "\n" + readme[end:]


# ---------------------------------------------------------------- the program

def outputs() -> dict[pathlib.Path, str]:
  """{file: the text the store and the notes give it}."""
  rows, notes = read_rows(), read_notes()
  problems = [f"row {i + 1}: {p}" for i, r in enumerate(rows) for p in row_problems(r)]
  if problems:
    raise ValueError(f"{STORE}:\n  " + "\n  ".join(problems))
  return {BENCHMARKS_MD: render(rows, notes),
          README: with_readme_table(README.read_text(), readme_table(rows, notes))}


def main(argv: list[str]) -> int:
  if set(argv) - {"--check"}:
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2
  stale = []
  for path, text in outputs().items():
    if path.read_text() != text:
      stale.append(path.name)
      if "--check" not in argv:
        path.write_text(text)
  if "--check" in argv:
    if stale:
      print(f"not what `make report` writes: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0
  print(f"wrote {', '.join(stale) or 'nothing (both up to date)'}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

"""XLA's optimized HLO text (`HloModule::ToString`, `compiled.as_text()`) read into
computations of instructions with their shapes: what `avtext.aot.hlo_cost` walks."""
import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
               "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16, "token": 0}

_ARRAY = re.compile(r"([a-z]+[0-9a-z]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*")
_CALLS = re.compile(r"\b(calls|body|condition|to_apply|branch_computations|"
                    r"async_execution_thread_computations)=\{?(%[\w.\-]+(?:,\s*%[\w.\-]+)*)\}?")


@dataclasses.dataclass
class Array:
  dtype: str
  dims: tuple[int, ...]
  layout: str  # "" when the text gives none

  @property
  def memory_space(self) -> int:
    m = re.search(r"S\((\d+)\)", self.layout)
    return int(m.group(1)) if m else 0

  def nbytes(self, tiled: bool = True) -> float:
    """Size in bytes; tiled: with the minor dimensions padded to the layout's first tile
    (a TPU's T(8,128): a 64-wide minor dimension takes 128 lanes)."""
    dims = list(self.dims)
    tile = re.search(r"T\(([\d,]+)\)", self.layout) if tiled else None
    if tile and dims:
      minor_to_major = [int(d) for d in self.layout[1:].split(":")[0].split(",") if d.strip()]
      sizes = [int(t) for t in tile.group(1).split(",")]
      for t, dim in zip(reversed(sizes), minor_to_major):
        if dim < len(dims):
          dims[dim] = -(-dims[dim] // t) * t
    return DTYPE_BYTES.get(self.dtype, 4) * math.prod(dims)


def parse_shape(text: str) -> list[Array]:
  """Every array of a (possibly tuple) HLO shape."""
  return [Array(d, tuple(int(x) for x in dims.split(",") if x), layout or "")
          for d, dims, layout in _ARRAY.findall(text)]


@dataclasses.dataclass
class Instruction:
  name: str
  shape: list[Array]
  opcode: str
  operands: list[str]
  attrs: str
  root: bool = False
  args: str = ""  # the text between the opcode's parentheses

  @property
  def op_name(self) -> str:
    m = re.search(r'op_name="([^"]*)"', self.attrs)
    return m.group(1) if m else ""

  def called(self) -> list[tuple[str, str]]:
    """(attribute, computation) for each computation this instruction calls."""
    return [(kind, c.strip().lstrip("%")) for kind, names in _CALLS.findall(self.attrs)
            for c in names.split(",")]


def _matching(text: str, start: int) -> int:
  """Index just past the bracket closing the one at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def parse_instruction(line: str) -> Instruction | None:
  m = _INSTR.match(line)
  if not m:
    return None
  rest = line[m.end():]
  end = _matching(rest, 0) if rest.startswith("(") else rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  opcode_end = rest.index("(")
  opcode = rest[:opcode_end]
  close = _matching(rest, opcode_end)
  operands = re.findall(r"%([\w.\-]+)", rest[opcode_end:close])
  return Instruction(m.group(2), parse_shape(shape), opcode, operands, rest[close:],
                     root=bool(m.group(1)), args=rest[opcode_end + 1:close - 1])


def _logical_lines(text: str):
  """The module's lines with an instruction's continuation lines joined to it: an
  attribute's string may hold newlines (the splash kernel's "xprof_metadata"), and a
  continuation line may start with "}" without closing the computation."""
  pending = None
  for line in text.splitlines():
    starts = (_INSTR.match(line) or _HEADER.match(line) or line.rstrip() == "}" or
              not line.strip() or line.startswith(("HloModule", "//")))
    if starts:
      if pending is not None:
        yield pending
      pending = line
    elif pending is not None:
      pending += "\n" + line
  if pending is not None:
    yield pending


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """({computation: instructions}, entry computation name)."""
  computations, entry, current = {}, None, None
  for line in _logical_lines(text):
    header = _HEADER.match(line)
    if header and line.rstrip().endswith("{"):
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
      continue
    if current is None:
      continue
    if line.rstrip() == "}":
      current = None
      continue
    instruction = parse_instruction(line)
    if instruction:
      computations[current].append(instruction)
  if entry is None:
    raise ValueError("HLO text has no ENTRY computation")
  return computations, entry


def trip_count(loop: Instruction, computations) -> int:
  """Iterations of a `while`: its known_trip_count, else the constant its condition
  compares the counter with (scan's `i < N`); 1 when neither is readable."""
  known = re.search(r'known_trip_count[^0-9]*(\d+)', loop.attrs)
  if known:
    return int(known.group(1))
  condition = dict(loop.called()).get("condition")
  constants = [int(i.args) for i in computations.get(condition, [])
               if i.opcode == "constant" and re.fullmatch(r"-?\d+", i.args)]
  return max(constants) if constants else 1



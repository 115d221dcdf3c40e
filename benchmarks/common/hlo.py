"""What a compiled CPU program's optimized HLO holds: its products and the bytes its other
kernels move (benchmarks/speed/dtype_step_cpu.py), and the size of a dumped buffer
assignment (benchmarks/speed/aot_scenic.py). Loop-free programs only: a loop's trip count
is not read here (`avtext.aot.hlo_cost` reads them, for the TPU cost model)."""
import collections
import re

import numpy as np

_INSTR = re.compile(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r"%[\w.\-]+ = \w+\[[\d,]*\]\{[\d,]*\} dot\(%([\w.\-]+), %([\w.\-]+)\)"
                  r"((?:, \w+_dims=\{[\d,]*\})*)")


def hlo_dots(hlo_text: str) -> collections.Counter:
  """Counter {(dtype, lhs shape, rhs shape, dimension numbers): count} of the dots."""
  if " while(" in hlo_text:
    raise ValueError("hlo_dots: the module has a loop; its dots' trip counts are unknown")
  shapes = {m.group(1): (m.group(2), tuple(int(x) for x in m.group(3).split(",") if x))
            for m in _INSTR.finditer(hlo_text)}
  dots = collections.Counter()
  for m in _DOT.finditer(hlo_text):
    (dtype, lhs), (_, rhs) = shapes[m.group(1)], shapes[m.group(2)]
    dims = dict(re.findall(r"(\w+)_dims=\{([\d,]*)\}", m.group(3)))
    parse = lambda k: tuple(int(x) for x in dims.get(k, "").split(",") if x)
    dnums = ((parse("lhs_contracting"), parse("rhs_contracting")),
             (parse("lhs_batch"), parse("rhs_batch")))
    dots[(dtype, lhs, rhs, dnums)] += 1
  return dots


_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f64": 8,
          "pred": 1, "s8": 1, "u8": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_ENTRY_OP = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_NOT_KERNELS = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast")


def _shape_bytes(text: str) -> int:
  return sum(_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
             for dtype, dims in _SHAPE.findall(text))


def hlo_traffic(hlo_text: str) -> tuple[int, int]:
  """(bytes, kernels) of the entry computation's kernels that are not products: for each
  top-level instruction other than a dot, a convolution or a fusion holding one (and other
  than parameters, tuples, constants and bitcasts, which move nothing), the bytes of its
  operands and of its result. What XLA's fusion plan reads and writes outside the
  products, each operand counted once per kernel that reads it."""
  if " while(" in hlo_text:
    raise ValueError("hlo_traffic: the module has a loop; its trip counts are unknown")
  bodies, name = {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"^(ENTRY )?%([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      name = "ENTRY" if head.group(1) else head.group(2)
      bodies[name] = []
    elif name is not None:
      bodies[name].append(line)
  sizes, total, kernels = {}, 0, 0
  for line in bodies["ENTRY"]:
    m = _ENTRY_OP.match(line)
    if not m:
      continue
    name, result, op, rest = m.groups()
    sizes[name] = _shape_bytes(result)
    if op in _NOT_KERNELS:
      continue
    calls = re.search(r"calls=%([\w.\-]+)", rest)
    body = "\n".join(bodies.get(calls.group(1), [])) if calls else ""
    if op in ("dot", "convolution") or " dot(" in body or " convolution(" in body:
      continue
    operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
    total += sizes[name] + sum(sizes.get(o, 0) for o in operands)
    kernels += 1
  return total, kernels


def dot_flops(lhs, rhs, dnums) -> int:
  """2 x output elements x contracted length of one dot_general."""
  (lc, _), (lb, _) = dnums
  batch = int(np.prod([lhs[d] for d in lb]))
  contracted = int(np.prod([lhs[d] for d in lc]))
  free_l = int(np.prod(lhs)) // batch // contracted
  free_r = int(np.prod(rhs)) // batch // contracted
  return 2 * batch * free_l * free_r * contracted


def buffer_assignment_bytes(text: str) -> int:
  """Sum of the allocations of an XLA buffer assignment dump (`allocation N: size S, ...`)."""
  return sum(int(m.group(1)) for m in re.finditer(r"^allocation \d+: size (\d+)", text, re.M))

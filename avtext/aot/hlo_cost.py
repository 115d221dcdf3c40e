"""What a compiled XLA program moves and computes, read from its optimized HLO text.

`analyze_hlo(text)` walks every kernel the program launches -- the instructions of
the entry computation and of the computations it runs as loops, conditionals and
calls, each weighted by how often it runs (a `while` loop's trip count, read from
its condition or its `known_trip_count`) -- and counts per kernel

  bytes   what it reads and writes in device memory (HBM): the operands and
          outputs that live in memory space 0, at their tiled (padded) size, where
          a fused operand only sliced (`dynamic-slice`, `slice`) counts the slices
          and an in-place `dynamic-update-slice` counts the update only; operands
          kept in on-chip memory (a TPU's VMEM, `S(1)` in the layout) cost nothing
          here, their prefetches (`copy-start`) count once; a Pallas flash kernel
          re-reads one side's operands once per block of the other side
  flops   2 x multiply-adds of every `dot` / `convolution` inside it, and for the
          flash-attention kernels of `avtext.models.attention` (Mosaic custom calls
          XLA cannot look into) the attention FLOPs from their shapes
  comm    the bytes each collective (all-gather, reduce-scatter, all-reduce,
          all-to-all, collective-permute) moves over the interconnect per device,
          ring algorithms: (n - 1) / n of the gathered or scattered array, twice
          that for an all-reduce, the whole array for a permute

and sorts it into an op class (`OP_CLASSES`). XLA's own `cost_analysis()` counts a
loop's body once whatever its trip count, sees no FLOPs in a Mosaic kernel and
charges on-chip operands as memory traffic; this count has none of those gaps, which
is why `avtext.aot` takes its bound from it (tests/test_aot.py checks it against the
unrolled program's XLA count). The text format is XLA's `HloModule::ToString`
(`compiled.as_text()`), for any backend.
"""
import collections
import dataclasses
import math
import re

from avtext.aot.hlo_text import Array, Instruction, parse_module, trip_count

# The op classes of the breakdown, in report order.
OP_CLASSES = ("matmul/conv", "attention kernels", "elementwise/norm fusions",
              "copies/transposes", "collectives", "optimizer update", "other")

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
# Instructions that launch nothing (or whose work is counted where it is started).
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
         "partition-id", "replica-id", "copy-done", "opt-barrier", "add-dependency",
         "all-gather-done", "all-reduce-done", "collective-permute-done", "async-done",
         "send-done", "recv-done", "iota", "slice-done"}
# Custom calls that only allocate or re-label buffers (TPU).
_FREE_CALLS = ("AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound")
# Fused computations made only of these move data without computing on it.
_MOVES = {"parameter", "copy", "transpose", "bitcast", "reshape", "broadcast", "pad",
          "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "constant",
          "tuple", "get-tuple-element", "convert", "reverse", "iota"}
_SLICES = {"dynamic-slice", "slice"}
# Elementwise ops a GPU computes on its special-function units (one result per element).
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                   "logistic", "rsqrt", "sqrt", "cbrt", "erf", "power", "sine", "cosine",
                   "atan2"}

def _hbm_bytes(arrays, all_spaces: bool = False) -> float:
  return sum(a.nbytes() for a in arrays if all_spaces or a.memory_space == 0)


@dataclasses.dataclass
class Kernel:
  """One launched instruction, its costs for all its runs."""
  name: str
  opcode: str
  op_class: str
  runs: int
  bytes: float
  flops: float
  comm_bytes: float
  op_name: str
  # (FLOPs of all runs, m, n, k) of each product inside: rows, output columns, contracted
  # (an attention kernel's products: query rows, head dim, keys; `Chip.matmul_tile`).
  dots: tuple = ()
  transcendentals: float = 0.0  # exp / log / tanh / ... results, all runs
  async_comm: bool = False  # a collective XLA made asynchronous (overlaps other kernels)
  # A copy XLA made asynchronous (`copy-start`, `slice-start`: a TPU's prefetches into
  # VMEM and async slices, run by its DMA engines while other kernels run).
  async_copy: bool = False


@dataclasses.dataclass
class HloCost:
  kernels: list[Kernel]
  unreadable_loops: int  # while loops whose trip count could not be read (counted once)

  @property
  def bytes(self) -> float:
    return sum(k.bytes for k in self.kernels)

  @property
  def flops(self) -> float:
    return sum(k.flops for k in self.kernels)

  @property
  def comm_bytes(self) -> float:
    return sum(k.comm_bytes for k in self.kernels)

  def by_class(self) -> dict[str, dict[str, float]]:
    out = {c: {"bytes": 0.0, "flops": 0.0, "comm_bytes": 0.0, "kernels": 0}
           for c in OP_CLASSES}
    for k in self.kernels:
      row = out[k.op_class]
      row["bytes"] += k.bytes
      row["flops"] += k.flops
      row["comm_bytes"] += k.comm_bytes
      row["kernels"] += k.runs
    return out

  def largest(self, n: int = 15) -> list[Kernel]:
    """The n kernels moving the most bytes (all runs of one instruction together)."""
    return sorted(self.kernels, key=lambda k: -k.bytes)[:n]


def _group_size(attrs: str, num_devices: int) -> int:
  """Devices in each replica group of a collective."""
  groups = re.search(r"replica_groups=\{\{([\d,]+)\}", attrs)
  if groups:
    return len(groups.group(1).split(","))
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)  # [groups, size]<=[...]
  if iota:
    return int(iota.group(2))
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if mesh:
    sizes = dict((k.strip("' "), int(v)) for k, v in
                 (p.split("=") for p in mesh.group(1).split(",")))
    return math.prod(sizes[a.strip("' ")] for a in mesh.group(2).split(",") if a.strip())
  return num_devices


def _collective_bytes(i: Instruction, symbols: dict[str, list[Array]],
                      num_devices: int) -> float:
  """Interconnect bytes a device sends for one run of collective `i` (ring algorithms)."""
  kind = next((c for c in COLLECTIVES if i.opcode.startswith(c)), None)
  if kind is None:
    return 0.0
  n = _group_size(i.attrs, num_devices)
  out = sum(a.nbytes(tiled=False) for a in i.shape[:1] if i.opcode.endswith("-start")) or \
      sum(a.nbytes(tiled=False) for a in i.shape)
  operand = sum(a.nbytes(tiled=False) for o in i.operands for a in symbols.get(o, []))
  if kind == "collective-permute":
    return operand
  if n <= 1:
    return 0.0
  if kind == "all-gather":
    return out * (n - 1) / n
  if kind == "reduce-scatter":
    return operand * (n - 1) / n
  if kind == "all-reduce":
    return 2 * operand * (n - 1) / n
  return operand * (n - 1) / n  # all-to-all


def _dims_attr(attrs: str, key: str) -> list[int]:
  """A dot's dimension numbers: `key={1,2}`, or in a cuBLAS call's backend config
  `"<key, dims spelled dimensions>":["1","2"]`."""
  m = re.search(key + r"=\{([\d,]*)\}", attrs)
  if m:
    return [int(d) for d in m.group(1).split(",") if d]
  m = re.search('"' + key.replace("_dims", "_dimensions") + r'":\s*\[([^\]]*)\]', attrs)
  return [int(d.strip().strip('"')) for d in m.group(1).split(",") if d.strip()] if m else []


def _dot(i: Instruction, symbols) -> tuple[float, int, int, int] | None:
  """(FLOPs, m, n, k) of one run of a `dot` or `convolution`: m rows, n output columns,
  k contracted (a convolution's k: the kernel's input features x its taps per output)."""
  if i.opcode == "dot" or (i.opcode == "custom-call" and "gemm_backend_config" in i.attrs):
    lhs, rhs = (symbols.get(o, [None])[0] for o in (i.operands + ["", ""])[:2])
    contract = _dims_attr(i.attrs, "lhs_contracting_dims")
    if lhs is None or rhs is None or not contract:
      return None
    def free(array, side):  # the product of a side's dims neither contracted nor batch
      skip = set(_dims_attr(i.attrs, f"{side}_contracting_dims") +
                 _dims_attr(i.attrs, f"{side}_batch_dims"))
      return math.prod(d for j, d in enumerate(array.dims) if j not in skip)
    k = math.prod(lhs.dims[d] for d in contract)
    m, n = free(lhs, "lhs"), free(rhs, "rhs")
    out = math.prod(i.shape[0].dims) if i.shape else 0
    return 2.0 * out * k, m, n, k
  if (i.opcode == "convolution" or "__cudnn$conv" in i.attrs) and len(i.operands) > 1:
    macs = _conv_macs(i, symbols)
    labels = re.search(r"dim_labels=[0-9a-z]+_[0-9a-z]+->([0-9a-z]+)", i.attrs)
    if not macs or not labels or not i.shape:
      return (2.0 * macs, 1, 1, 1) if macs else None
    _, rhs, out = _conv_arrays(i, symbols)
    rhs_l = re.search(r"dim_labels=[0-9a-z]+_([0-9a-z]+)->", i.attrs).group(1)
    n = out.dims[labels.group(1).index("f")]
    positions = math.prod(out.dims) // max(1, n)  # output rows: batch x spatial
    k = max(1, round(macs / (positions * n)))
    k = max(k, rhs.dims[rhs_l.index("i")] if rhs is not None else 1)
    return 2.0 * macs, max(1, round(macs / (n * k))), n, k
  return None


def _valid_taps(out: int, size: int, window: int, stride: int, lo: int,
                rhs_dilate: int, lhs_dilate: int) -> int:
  """(output, window) position pairs of one spatial dimension that land on an input
  element (not on padding or between dilated inputs)."""
  if lhs_dilate == 1:
    total = 0
    for o in range(out):
      start = o * stride - lo  # input index of tap k: start + k * rhs_dilate
      k_min = max(0, -(start // rhs_dilate)) if start < 0 else 0
      k_max = min(window - 1, (size - 1 - start) // rhs_dilate) if size - 1 >= start else -1
      total += max(0, k_max - k_min + 1)
    return total
  dilated = (size - 1) * lhs_dilate + 1
  return sum(1 for o in range(out) for k in range(window)
             if 0 <= (p := o * stride + k * rhs_dilate - lo) < dilated and p % lhs_dilate == 0)


def _conv_arrays(i: Instruction, symbols) -> tuple:
  """(input, kernel, output) of the forward convolution `i` computes: cuDNN's backward
  calls keep the forward's window and dim_labels, the filter gradient taking (input,
  output gradient) to the kernel, the input gradient (output gradient, kernel) to the
  input."""
  first = [symbols.get(o, [None])[0] for o in i.operands[:2]] + [None, None]
  result = i.shape[0] if i.shape else None
  if "__cudnn$convBackwardFilter" in i.attrs:
    return first[0], result, first[1]
  if "__cudnn$convBackwardInput" in i.attrs:
    return result, first[1], first[0]
  return first[0], first[1], result


def _conv_macs(i: Instruction, symbols) -> float:
  """Multiply-adds of an HLO convolution (the TPU compiler writes matmuls as ones): for
  every spatial dimension the (output, tap) pairs on real input, times the output batch,
  output features and the kernel's input features (whatever the grouping)."""
  lhs, rhs, out = _conv_arrays(i, symbols)
  labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", i.attrs)
  if lhs is None or rhs is None or out is None or not labels:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  fields = {}
  window = re.search(r"window=\{([^}]*)\}", i.attrs)
  for part in (window.group(1).split() if window else []):
    key, _, value = part.partition("=")
    fields[key] = value.split("x")
  spatial = sorted(c for c in out_l if c.isdigit())
  macs = out.dims[out_l.index("b")] * out.dims[out_l.index("f")] * rhs.dims[rhs_l.index("i")]
  for n, d in enumerate(spatial):
    get = lambda key, default: fields.get(key, [default] * len(spatial))[n]
    lo = int(str(get("pad", "0_0")).split("_")[0])
    macs *= _valid_taps(out.dims[out_l.index(d)], lhs.dims[lhs_l.index(d)],
                        int(get("size", 1)), int(get("stride", 1)), lo,
                        int(get("rhs_dilate", 1)), int(get("lhs_dilate", 1)))
  return float(macs)


def _attention(i: Instruction, symbols) -> tuple[int, int, int, int, int] | None:
  """(products, scores, query rows, keys, head dim) of one run of a fused attention
  call, from its q, k operands (0 and 1): the Pallas TPU kernels ([B, H, L, d]: forward
  2 products of B H Lq Lk scores x d, the dK/dV kernel 4, the dQ kernel 3) and cuDNN's
  ([B, L, H, d]: forward 2, backward 5). Each computes the scores' exp once."""
  name = i.name.lower()
  if not re.search(r"flash|attention|mha", name) or len(i.operands) < 2:
    return None
  first = _splash_q(i, symbols) if "splash_mha" in name else 0
  if first is None or len(i.operands) < first + 2:
    return None
  q, k = (symbols.get(o, [None])[0] for o in i.operands[first:first + 2])
  if q is None or k is None or len(q.dims) != 4 or len(k.dims) != 4:
    return None
  if "__cudnn$fmha" in i.attrs:  # its [B, H, Lq, Lk] scores are in the backend config
    products = 5 if "Backward" in i.attrs else 2
    scores = re.search(r'"intermediate_tensor_shape":\s*\{[^}]*?"dimensions":\s*\[([^\]]*)\]',
                       i.attrs)
    if not scores:
      return None
    dims = [int(d.strip().strip('"')) for d in scores.group(1).split(",") if d.strip()]
    return products, math.prod(dims), dims[-2], dims[-1], q.dims[-1]
  products = 4 if "dkv" in name else 3 if "dq" in name else 2
  if "splash_mha_dkv" in name and any(len(a.dims) == 5 for a in i.shape):
    products = 5  # the fused backward kernel: dQ (its per-key-block partial sums) too
  return (products, math.prod(q.dims[:3]) * k.dims[2], q.dims[2], k.dims[2], q.dims[3])


def _splash_q(i: Instruction, symbols) -> int | None:
  """The query's operand index of a splash kernel call: its first [B, H, L, d] operand
  (the mask's scalar-prefetched block tables come first)."""
  for n, o in enumerate(i.operands):
    arrays = symbols.get(o, [])
    if arrays and len(arrays[0].dims) == 4:
      return n
  return None


def _splash_bytes(i: Instruction, symbols, all_spaces: bool) -> float:
  """HBM bytes of a splash kernel call (jax.experimental.pallas.ops.tpu.splash_attention,
  vmapped over the batch): the forward streams K, V and the key segment ids once per
  query block; the dK/dV (and fused dQ) kernel streams Q, the query segment ids, the
  log-sum-exp, dO and di once per key block; the rest once. Block sizes from the call's
  xprof metadata (128 when absent)."""
  q_at = _splash_q(i, symbols)
  operands = [symbols.get(o, []) for o in i.operands]
  blocks = lambda key: int(m.group(1)) if (m := re.search(
      r'\\?"' + key + r'\\?":\s*(\d+)', i.attrs)) else _FLASH_DEFAULT_BLOCK
  total = _hbm_bytes(i.shape, all_spaces)
  if q_at is None:
    return total + sum(_hbm_bytes(a, all_spaces) for a in operands)
  q, k = operands[q_at][0], operands[q_at + 1][0]
  if "splash_mha_dkv" in i.name:
    n = max(1, -(-k.dims[2] // blocks("block_kv_dkv")))
    streamed = {q_at} | set(range(q_at + 4, len(operands)))
  else:
    n = max(1, -(-q.dims[2] // blocks("block_q")))
    streamed = {q_at + 1, q_at + 2, q_at + 4}
  for j, arrays in enumerate(operands):
    total += _hbm_bytes(arrays, all_spaces) * (n if j in streamed else 1)
  return total


# The Pallas TPU flash kernels (jax.experimental.pallas.ops.tpu.flash_attention): the
# operands each re-reads once per major block of the other side, and where its block
# size is written (the backward kernels' names; `fused_attention.flash_block_sizes` scopes the
# forward's). Operands: forward (q, k, v, q_segment_ids, kv_segment_ids); both backward
# kernels (q, k, v, q_segment_ids, kv_segment_ids, l, m, do, di).
_FLASH_REREAD = {
    "fwd": ((1, 2, 4), "q", r"flash_fwd_block_q=(\d+)"),
    "dkv": ((0, 3, 5, 6, 7, 8), "k", r"flash_mha_bwd_dkv_\S*?block_k_major=(\d+)"),
    "dq": ((1, 2, 4), "q", r"flash_mha_bwd_dq_block_q_major=(\d+)"),
}
_FLASH_DEFAULT_BLOCK = 128  # the kernels' default block sizes


def _flash_kind(i: Instruction) -> str | None:
  if i.opcode != "custom-call" or "tpu_custom_call" not in i.attrs:
    return None
  name = i.name + " " + i.op_name
  if "flash_mha_bwd_dkv" in name:
    return "dkv"
  if "flash_mha_bwd_dq" in name:
    return "dq"
  # The forward: pallas' flash_attention, or our residual-naming wrapper's call of its
  # kernel, named by the block-size scope (`fused_attention.tpu_heads_first`).
  return "fwd" if "flash_attention" in name or "flash_fwd_block_q" in name else None


def _flash_bytes(i: Instruction, kind: str, symbols, all_spaces: bool) -> float:
  """HBM bytes of a Pallas flash-attention call, re-reads included: the operands of the
  streamed side once per major block of the other side (`_FLASH_REREAD`)."""
  reread, side, pattern = _FLASH_REREAD[kind]
  block = re.search(pattern, i.op_name + " " + i.name)
  block = int(block.group(1)) if block else _FLASH_DEFAULT_BLOCK
  operands = [symbols.get(o, []) for o in i.operands]
  q, k = (operands[0][0] if operands and operands[0] else None,
          operands[1][0] if len(operands) > 1 and operands[1] else None)
  length = (q if side == "q" else k).dims[2] if q is not None and k is not None else block
  blocks = max(1, -(-length // block))
  total = _hbm_bytes(i.shape, all_spaces)
  for n, arrays in enumerate(operands):
    total += _hbm_bytes(arrays, all_spaces) * (blocks if n in reread else 1)
  return total


def _sliced_bytes(body: list[Instruction], pname: str, computations, depth: int = 0):
  """Bytes the fused computation `body` reads of its parameter `pname` when it only
  slices it (directly, through bitcasts, or inside nested fusions: a scan's step reading
  its layer's slice of a stacked array); None when it reads it whole."""
  if depth > 8:
    return None
  total = 0.0
  uses = [b for b in body if pname in b.operands]
  if not uses:
    return None
  for u in uses:
    if u.opcode in _SLICES and u.operands[0] == pname and pname not in u.operands[1:]:
      total += _hbm_bytes(u.shape, True)
    elif u.opcode == "bitcast":
      inner = _sliced_bytes(body, u.name, computations, depth + 1)
      if inner is None:
        return None
      total += inner
    elif u.opcode == "fusion":
      nested = computations.get(dict(u.called()).get("calls", ""), [])
      names = {int(b.args): b.name for b in nested
               if b.opcode == "parameter" and b.args.strip().isdigit()}
      for n, o in enumerate(u.operands):
        if o != pname:
          continue
        inner = _sliced_bytes(nested, names.get(n, ""), computations, depth + 1)
        if inner is None:
          return None
        total += inner
    else:
      return None
  return total


def _fusion_bytes(i: Instruction, body: list[Instruction], symbols,
                  all_spaces: bool = False, computations=None) -> float:
  """HBM bytes of a fusion: operands (only their slices where the fused computation
  only slices them; none for the buffer an in-place dynamic-update-slice writes into)
  and outputs (only the update of an in-place dynamic-update-slice)."""
  params = {b.name: int(b.args) for b in body
            if b.opcode == "parameter" and b.args.strip().isdigit()}
  users = collections.defaultdict(list)
  for b in body:
    for o in b.operands:
      users[o].append(b)
  by_name = {b.name: b for b in body}
  root = next((b for b in body if b.root), body[-1] if body else None)
  roots = [by_name[o] for o in root.operands if o in by_name] if (
      root is not None and root.opcode == "tuple") else [root]
  in_place = {r.operands[0] for r in roots if r is not None and
              r.opcode == "dynamic-update-slice"}
  # A parameter the root tuple hands straight back (an aliased buffer an async
  # collective writes into) is neither read nor written by this kernel.
  passthrough = {o for o in (root.operands if root is not None and root.opcode == "tuple"
                             else []) if o in params}
  total = 0.0
  for pname, index in params.items():
    if index >= len(i.operands):
      continue
    arrays = symbols.get(i.operands[index], [])
    if not arrays or not (all_spaces or arrays[0].memory_space == 0):
      continue
    uses = users.get(pname, [])
    if pname in in_place or (pname in passthrough and all(u is root for u in uses)):
      continue
    sliced = _sliced_bytes(body, pname, computations or {})
    total += _hbm_bytes(arrays, all_spaces) if sliced is None else sliced
  outputs = i.shape if len(roots) == len(i.shape) else i.shape[:len(roots)] or i.shape
  for r, out in zip(roots, outputs):
    if not (all_spaces or out.memory_space == 0) or r is None or r.name in passthrough:
      continue
    if r is not None and r.opcode == "dynamic-update-slice" and len(r.operands) > 1:
      update = next((b for b in body if b.name == r.operands[1]), None)
      total += _hbm_bytes(update.shape, True) if update is not None else out.nbytes()
    else:
      total += out.nbytes()
  return total


def _classify(i: Instruction, fused: list[Instruction]) -> str:
  ops = {b.opcode for b in fused} | {i.opcode}
  if i.opcode == "custom-call" and re.search(r"flash|attention|mha", i.name.lower()):
    return "attention kernels"
  if ops & {"dot", "convolution"} or (  # XLA's collective matmuls (FSDP) included
      i.opcode == "custom-call" and re.search(r"__cudnn\$conv|__cublas", i.attrs)):
    return "matmul/conv"
  if any(o.startswith(COLLECTIVES) for o in ops):
    return "collectives"
  phase = i.op_name.split("/")[1] if i.op_name.count("/") else ""
  if i.opcode in ("fusion", "add", "multiply", "subtract", "divide") and phase and \
      phase[0].islower() and not phase.startswith(("jvp(", "transpose(", "checkpoint",
                                                   "remat", "while", "vmap(")):
    return "optimizer update"
  if i.opcode in ("copy", "copy-start", "transpose") or (
      i.opcode == "fusion" and fused and ops - {"fusion"} <= _MOVES):
    return "copies/transposes"
  if i.opcode == "fusion" or i.opcode in ("reduce", "add", "multiply", "exponential",
                                          "select", "convert", "broadcast"):
    return "elementwise/norm fusions"
  return "other"


def analyze_hlo(text: str, num_devices: int = 1, *, all_spaces: bool = False) -> HloCost:
  """The per-kernel costs of one run of the program in `text` (one device's program).

  all_spaces: count operands in every memory space (on-chip ones too), as XLA's
  `cost_analysis()` does; for comparing the two counts."""
  computations, entry = parse_module(text)
  symbols = {c: {i.name: i.shape for i in body} for c, body in computations.items()}
  kernels, unreadable = [], 0

  def fused_body(comp: str, depth: int = 0) -> list[tuple[str, Instruction]]:
    """(computation, instruction) of a fused computation and the fusions nested in it."""
    out = []
    for b in computations.get(comp, []):
      out.append((comp, b))
      if b.opcode == "fusion" and depth < 8:
        out.extend(fused_body(dict(b.called()).get("calls", ""), depth + 1))
    return out

  def walk(comp: str, runs: int, depth: int = 0, in_async: bool = False):
    nonlocal unreadable
    if depth > 16:
      return
    for i in computations[comp]:
      calls = dict(i.called())
      if i.opcode == "while":
        n = trip_count(i, computations)
        if n == 1 and "known_trip_count" not in i.attrs:
          unreadable += 1
        walk(calls["body"], runs * n, depth + 1, in_async)
        walk(calls["condition"], runs * n, depth + 1, in_async)
        continue
      if i.opcode in ("conditional", "call") or (i.opcode.startswith("async") and
                                                 i.opcode != "async-done"):
        for kind, c in i.called():
          if c in computations and kind != "to_apply":
            walk(c, runs, depth + 1, in_async or i.opcode.startswith("async"))
        if i.opcode in ("conditional", "call"):
          continue
      if i.opcode in _FREE or (i.opcode == "custom-call" and any(
          f'custom_call_target="{t}"' in i.attrs for t in _FREE_CALLS)):
        continue
      nested = fused_body(calls["calls"]) if i.opcode == "fusion" else []
      fused = [b for _, b in nested]
      local = symbols[comp]
      dots = []
      if i.opcode == "fusion":
        nbytes = _fusion_bytes(i, computations.get(calls["calls"], []), local, all_spaces,
                               computations)
        dots = [d for c, b in nested if (d := _dot(b, symbols[c]))]
        # An async collective is cloned into the kernel that starts it and the one that
        # waits for it (root AsyncCollectiveDone): its bytes are sent once, at the start.
        done = any(b.root and 'AsyncCollectiveDone' in b.attrs
                   for b in computations.get(calls["calls"], []))
        comm = 0.0 if done else sum(_collective_bytes(b, symbols[c], num_devices)
                                    for c, b in nested)
        is_async = done or any("AsyncCollective" in b.attrs for b in fused)
        transcendentals = sum(math.prod(b.shape[0].dims) for b in fused
                              if b.opcode in _TRANSCENDENTAL and b.shape)
      else:
        operands = [a for o in i.operands for a in local.get(o, [])]
        outputs = i.shape[:1] if i.opcode == "copy-start" else i.shape
        if i.opcode == "slice-start":  # shape ((operand), slice, sync): moves the slice
          src = operands[0] if operands else None
          operands = [dataclasses.replace(i.shape[1], layout=src.layout)] if (
              src is not None and len(i.shape) > 1) else []
          outputs = i.shape[1:2]
        if i.opcode == "custom-call" and len(outputs) > 1 and outputs[-1].dtype in (
            "s8", "u8") and len(outputs[-1].dims) == 1:
          outputs = outputs[:-1]  # a cuBLAS / cuDNN call's scratch workspace
        nbytes = _hbm_bytes(operands, all_spaces) + _hbm_bytes(outputs, all_spaces)
        if (flash := _flash_kind(i)) is not None:
          nbytes = _flash_bytes(i, flash, local, all_spaces)
        elif i.opcode == "custom-call" and "splash_mha" in i.name:
          nbytes = _splash_bytes(i, local, all_spaces)
        dots = [d] if (d := _dot(i, local)) else []
        transcendentals = math.prod(i.shape[0].dims) if (
            i.opcode in _TRANSCENDENTAL and i.shape) else 0
        if i.opcode == "custom-call" and (attention := _attention(i, local)):
          products, scores, lq, lk, head = attention
          dots.append((2.0 * products * scores * head, lq, head, lk))
          transcendentals = scores
        comm = _collective_bytes(i, local, num_devices)
        is_async = in_async or i.opcode.endswith("-start")
      flops = sum(d[0] for d in dots)
      kernels.append(Kernel(
          i.name, i.opcode, _classify(i, fused), runs, runs * nbytes, runs * flops,
          runs * comm, i.op_name, tuple((runs * f, m, n, k) for f, m, n, k in dots),
          runs * transcendentals, bool(comm) and is_async,
          i.opcode in ("copy-start", "slice-start")))

  walk(entry, 1)
  return HloCost(kernels, unreadable)

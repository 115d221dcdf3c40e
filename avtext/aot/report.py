"""The text of `python -m avtext.aot`'s report: what a compiled config needs, costs and
would take (`format_report`), what to change when it does not fit (`advice`), and what
its whole schedule costs before it is launched (`plan`, `format_plan`)."""
import math


def advice(report: dict) -> str:
  """What to change when a config does not fit (or fits without 10 % headroom)."""
  steps = []
  if report["dtype"] == "float32":
    steps.append("--config.model.dtype=bfloat16")
  if report["remat"] == "none":
    steps.append("--config.model.remat=full")
  if not report["fsdp"]:
    steps.append("--config.partitioning.fsdp=True")
  steps.append(f"--config.train.microbatches={2 * report['microbatches']} (tasks with "
               "an encode/combine split)")
  steps.append("a larger slice (--topology)")
  return "; or ".join(steps)


def format_report(r: dict, breakdown: bool = False) -> str:
  lines = [
      f"{r['topology']} ({r['chips']} x {r['chip']}, mesh {r['mesh']}), global batch "
      f"{r['global_batch']} in {r['microbatches']} micro-batch(es), {r['dtype']} compute, "
      f"remat {r['remat']}, attention {r['attention']}, FSDP {'on' if r['fsdp'] else 'off'}"
      f"{', layers scanned' if r.get('scan_layers') else ''}",
      f"  HBM per chip     {r['hbm_needed_gib']:.2f} GiB needed of {r['hbm_per_chip_gib']:.2f} "
      f"GiB ({100 * r['headroom']:.0f} % headroom): args {r['memory_gib']['argument']:.2f}, "
      f"outputs {r['memory_gib']['output']:.2f}, temporaries {r['memory_gib']['temp']:.2f}, "
      f"aliased {r['memory_gib']['alias']:.2f}",
      f"  FLOPs per chip   {r['flops_per_chip'] / 1e9:,.0f} GFLOP per step "
      f"(model {r['model_flops_per_chip'] / 1e9:,.0f} without remat)",
      f"  HBM traffic      {r['bytes_per_chip'] / 1e9:,.1f} GB per step per chip",
      f"  interconnect     {r['comm_bytes_per_chip'] / 1e9:,.2f} GB sent per step per chip",
      f"  step bound       {1e3 * r['step_time_lower_bound_s']:,.1f} ms, set by "
      f"{r['bound_by']} = max(compute {1e3 * r['compute_bound_s']:,.1f} ms, HBM "
      f"{1e3 * r['memory_bound_s']:,.1f} ms, ICI {1e3 * r['ici_bound_s']:,.1f} ms); "
      f"MFU at the bound {100 * r['mfu_at_bound']:.1f} %",
  ]
  p = r.get("predicted")
  if p:
    lines.append(
        f"  predicted step   {1e3 * p['step_s']:,.1f} ms, MFU {100 * p['mfu']:.1f} %: its "
        f"{p['launches']:,} kernel runs one after another, each at its own limit "
        f"(launches {1e3 * p['launch_s']:,.1f} ms"
        f"{'; bound by the interconnect' if p['bound_by'] == 'ICI' else ''})")
  lines.append(f"  compile          {r['compile_s']:.0f} s (lowering {r['lower_s']:.0f} s)")
  if breakdown:
    lines.append("  by op class                 HBM GB    GFLOP  ICI GB  kernels  share of "
                 "bound  predicted")
    for name, b in r["breakdown"].items():
      c = p["by_class"][name] if p else None
      lines.append(f"    {name:26s} {b['bytes'] / 1e9:7.1f} {b['flops'] / 1e9:8,.0f} "
                   f"{b['comm_bytes'] / 1e9:7.2f} {b['kernels']:8d}  "
                   f"{100 * b['share_of_bound']:5.1f} %     "
                   + (f"{1e3 * c['time_s']:8,.1f} ms ({100 * c['share']:4.1f} %)" if c else ""))
    lines.append("  largest kernels by bytes (all runs)")
    for k in r["largest"]:
      lines.append(f"    {k['bytes'] / 1e9:7.2f} GB x{k['runs']:<3d} {k['op_class']:24s} "
                   f"{k['name'][:36]:36s} {k['op_name'][-70:]}")
    if p:
      lines.append("  costliest kernels by predicted time (all runs; fill of the matmul unit)")
      for k in p["costliest"]:
        fill = f"fill {k['fill']:.2f}" if k["fill"] is not None else ""
        lines.append(f"    {1e3 * k['time_s']:8.2f} ms x{k['runs']:<3d} {k['op_class']:24s} "
                     f"{k['bound_by']:7s} {fill:9s} {k['name'][:32]:32s} "
                     f"{k['op_name'][-60:]}")
  if "extrapolated" in r:
    e = r["extrapolated"]
    lines.append(
        f"  unrolled, extrapolated from {len(e['programs'])} programs (stacks "
        f"{e['stacks']}): {e['flops_per_chip'] / 1e9:,.0f} GFLOP, "
        f"{e['bytes_per_chip'] / 1e9:,.1f} GB HBM, {e['comm_bytes_per_chip'] / 1e9:,.2f} GB "
        f"ICI; bound {1e3 * e['step_time_lower_bound_s']:,.1f} ms ({e['bound_by']}), MFU "
        f"{100 * e['mfu_at_bound']:.1f} %")
  for name, p in (r.get("predict") or {}).items():
    lines.append(f"  predict {name}: {p['hbm_needed_gib']:.2f} GiB, compiled in "
                 f"{p['compile_s']:.0f} s{'' if p['fits'] else ' (does not fit)'}")
  if r["fits"]:
    lines.append("fits" + ("" if r["headroom"] >= 0.1 else
                           f" (under 10 % headroom; to gain some: {advice(r)})"))
  else:
    lines.append(f"does not fit: {advice(r)}")
  return "\n".join(lines)

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


def plan(report: dict, config, *, examples: int | None = None,
         eval_examples: int | None = None) -> dict:
  """What the config's whole schedule costs on the report's slice, before it is launched:
  its train steps (config.train.num_steps, else num_epochs x examples / global batch,
  `trainer.total_train_steps`) at the predicted step, and each evaluator's passes (every
  `every_steps` / `every_epochs` and at the end, as the trainer runs them), each running
  its predict functions over `eval_examples` at their predicted time per batch.
  `examples`: training examples an epoch (else config.dataset.num_examples)."""
  from avtext import evals  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer  # pylint: disable=g-import-not-at-top
  examples = examples or (config.get("dataset") or {}).get("num_examples")
  if config.train.get("num_steps") is None and not examples:
    raise ValueError(
        f"config.train.num_epochs={config.train.get('num_epochs')} counts epochs, and the "
        "config gives no dataset size (config.dataset.num_examples): pass --examples=N, "
        "the training examples an epoch")
  total, per_epoch = trainer.total_train_steps(config, int(examples or 10 ** 6))
  step_s = report["predicted"]["step_s"]
  out = {"topology": report["topology"], "chips": report["chips"], "steps": total,
         "steps_per_epoch": per_epoch if examples else None, "examples": examples,
         "step_s": step_s, "train_s": total * step_s, "eval_examples": eval_examples,
         "evals": {}}
  predicted = report.get("predict") or {}
  eval_s = 0.0
  for name, cfg in (config.get("evals") or {}).items():
    every = (int(round(cfg.every_epochs * per_epoch)) if cfg.get("every_epochs") and examples
             else int(cfg.get("every_steps") or 0))
    passes = total // every + (1 if total % every else 0) if every else 1
    fns = evals.get_evaluator(cfg.get("type")).predict_fn_names(cfg)
    per_pass = None
    if eval_examples and all(f in predicted for f in fns):
      per_pass = sum(math.ceil(eval_examples / predicted[f]["batch"]) * predicted[f]["predicted_s"]
                     for f in fns)
      eval_s += passes * per_pass
    out["evals"][name] = {"passes": passes, "every_steps": every, "predict_fns": list(fns),
                          "pass_s": per_pass}
  out["eval_s"] = eval_s if eval_examples else None
  out["total_s"] = out["train_s"] + eval_s
  out["chip_hours"] = out["total_s"] * report["chips"] / 3600
  return out


def format_plan(p: dict) -> str:
  hours = lambda s: (f"{s / 3600:,.1f} h" if s >= 3600 else f"{s / 60:,.1f} min" if s >= 60
                     else f"{s:,.1f} s")
  lines = [f"plan on {p['topology']} ({p['chips']} chips): {p['steps']:,} train steps"
           + (f" ({p['steps_per_epoch']:,} an epoch of {p['examples']:,} examples)"
              if p["steps_per_epoch"] else "")
           + f" at the predicted {1e3 * p['step_s']:,.1f} ms: {hours(p['train_s'])}"]
  for name, e in p["evals"].items():
    when = f"every {e['every_steps']:,} steps and at the end" if e["every_steps"] else "at the end"
    cost = (f"{hours(e['pass_s'])} a pass over {p['eval_examples']:,} examples"
            if e["pass_s"] is not None else
            "not timed (pass --eval_examples=N and keep --evals on)")
    lines.append(f"  eval {name}: {e['passes']} pass(es) ({when}) of "
                 f"{', '.join(e['predict_fns']) or 'no predict function'}: {cost}")
  lines.append(f"  total {hours(p['total_s'])} wall, {p['chip_hours']:,.1f} chip-hours"
               + ("" if p["eval_s"] is not None else " (training only)"))
  return "\n".join(lines)

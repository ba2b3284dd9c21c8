"""`ms-llm benchmark --memory`: where the training step's peak memory goes, measured, beside the planner's
prediction for the same config.

Each measurement is a fresh process (`probe`) that runs the real step and records its resident memory at
phase boundaries: after importing MindSpore and setting the context, after building the session (model,
optimizer, data pipeline), after compiling the step, and the peak over the steps. On CPU the phases are read
from /proc/self/status, resetting the peak (VmHWM) between phases through /proc/self/clear_refs; on Ascend and
GPU from MindSpore's memory-pool statistics (device memory: no import baseline).

The terms of the full run's peak:

  runtime baseline        the process after `import mindspore` and the context (measured)
  parameters              the model's float32 weights          (the tensors' own sizes, as MindSpore reports them)
  gradients               one per trainable weight, plus the accumulation buffers when accumulating
  optimizer states        AdamW's two moments
  compiled graphs         compile + session growth, less the weights (measured)
  activations kept for    difference run: the same config with one layer; the per-layer growth of the step
  backward                less the extra layers' gradients and moments, times the layers
  logits and loss path    difference run: the same config at the dataset's own vocabulary; the step's growth
                          less the larger head's gradients and moments (0 when the vocabulary is the data's)
  the rest                peak minus all of the above: the backward's transients at the peak, allocator slack

so the parts sum to the peak by construction; what is measured is how the peak splits between them.
"""
import json
import os
import subprocess
import sys

from ms_llm.errors import UserError

MIB = 2 ** 20
TERMS = ("runtime baseline", "parameters", "gradients", "optimizer states", "compiled graphs",
         "activations kept for backward", "logits and loss path", "the rest")
PLANNED = {"parameters": "weights", "gradients": "gradients", "optimizer states": "optimizer states",
           "activations kept for backward": "activations", "logits and loss path": "logits",
           "runtime baseline": "runtime baseline", "compiled graphs": "compiled graphs"}


# -- one process: the phases of the real step ------------------------------------------------------------

def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak():
    """Reset VmHWM to the current resident set (Linux ≥ 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class HostMemory:
    """Resident set and its peak since the last reset (CPU)."""

    def now(self):
        return _status("VmRSS")

    def peak(self):
        return _status("VmHWM")

    def reset(self):
        if not _reset_peak():
            raise UserError("benchmark --memory needs /proc/self/clear_refs to measure each phase's peak (Linux 4.0 "
                            "or later, not inside a sandbox that hides it).")


class DeviceMemory:
    """MindSpore's memory-pool statistics (Ascend, GPU): bytes allocated by tensors, peak since the last reset."""

    def __init__(self):
        import mindspore as ms

        self.rt = ms.runtime

    def now(self):
        return self.rt.memory_allocated()

    def peak(self):
        return self.rt.max_memory_allocated()

    def reset(self):
        self.rt.reset_peak_memory_stats()


def state_bytes(session):
    """Bytes of the tensors the step owns, by role, from the live Parameters."""
    step = session.step_fn

    def total(params):
        return int(sum(p.nbytes for p in params))

    weights = list(session.model.get_parameters())
    trainable = list(session.model.trainable_params())
    opt = step.optimizer
    buffers = step.state.grad_buffers if getattr(step.state, "grad_buffers", None) is not None else ()
    return {"weights": total(weights), "gradients": total(trainable), "accumulation buffers": total(buffers),
            "moments": total(list(opt.exp_avg) + list(opt.exp_avg_sq)),
            "layer weights": total(session.model.layers[0].get_parameters()), "layers": len(session.model.layers)}


def probe(cfg, steps):
    """Phase memory of the real step in this process (dict of bytes)."""
    import mindspore  # noqa: F401 (the import is the first phase)

    from ms_llm.train.setup.context import select_device
    from ms_llm.train.setup.dataset import prepared_runtime
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    target = select_device(cfg.context)
    mem = HostMemory() if target == "CPU" else DeviceMemory()
    out = {"device": target, "import": mem.now()}
    s = open_session(cfg, echo=lambda *a: None, rt=prepared_runtime(cfg, lambda *a: None))
    runner = StepRunner(s, use_compile_cache=False)
    out["session"] = mem.now()
    batches = s.next_batches()
    mem.reset()
    runner.compile(batches)
    out["compiled"], out["compile peak"] = mem.now(), mem.peak()
    mem.reset()
    for i in range(steps):
        runner.step(batches if i == 0 else None)[0].asnumpy()
    out["peak"], out["after steps"] = mem.peak(), mem.now()
    out.update(state_bytes(s))
    out["vocab"], out["data vocab"] = s.cfg.model.vocab_size, s.manifest["vocab_size"]
    return out


def probe_main(argv):
    """`python -m ms_llm.benchmark_memory --config C [--set k=v ...] --steps N`: one probe, a JSON line."""
    import argparse

    from ms_llm.config import load_config
    from ms_llm.config.cli_args import add_config_arguments

    ap = argparse.ArgumentParser()
    add_config_arguments(ap, required=False)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    print(json.dumps(probe(load_config(args.config, args.overrides), args.steps)), flush=True)


# -- the difference runs ---------------------------------------------------------------------------------

def run_probe(config, overrides, steps, echo):
    cmd = [sys.executable, "-m", "ms_llm.benchmark_memory", "--steps", str(steps)]
    if config:
        cmd += ["--config", config]
    for o in overrides:
        cmd += ["--set", o]
    echo(f"  measuring: {' '.join(o for o in overrides if not o.startswith('monitor.')) or 'the config as given'}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, GLOG_v="3"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        raise UserError("benchmark --memory: a measurement run failed:\n  " + "\n  ".join(tail))
    return json.loads(lines[-1])


def breakdown(full, other_depth=None, data_vocab=None):
    """The terms (bytes) of the full run's peak from the probes; see the module docstring. `other_depth`: the
    same config with another number of layers; `data_vocab`: at the dataset's vocabulary."""
    step_growth = full["peak"] - full["compiled"]
    terms = {"runtime baseline": full["import"] if full["device"] == "CPU" else 0,
             "parameters": full["weights"],
             "gradients": full["gradients"] + full["accumulation buffers"],
             "optimizer states": full["moments"]}
    terms["compiled graphs"] = max(0, full["compiled"] - terms["runtime baseline"] - full["weights"])
    activations = 0
    if other_depth is not None and other_depth["layers"] != full["layers"]:
        extra = full["layers"] - other_depth["layers"]
        growth = step_growth - (other_depth["peak"] - other_depth["compiled"])
        state = 3 * full["layer weights"] * extra  # the extra layers' gradients and two moments
        activations = max(0, (growth - state) / extra * full["layers"])
    terms["activations kept for backward"] = activations
    logits = 0
    if data_vocab is not None and full["vocab"] != data_vocab["vocab"]:
        growth = step_growth - (data_vocab["peak"] - data_vocab["compiled"])
        state = (full["gradients"] + full["moments"]) - (data_vocab["gradients"] + data_vocab["moments"])
        logits = max(0, growth - state)
    terms["logits and loss path"] = logits
    terms["the rest"] = full["peak"] - sum(terms.values())
    return terms


def measure(config, overrides, steps=3, echo=print):
    """Probe the config, the config with one layer (two when it has one) and at the dataset's vocabulary."""
    full = run_probe(config, overrides, steps, echo)
    depth = run_probe(config, overrides + [f"model.num_layers={1 if full['layers'] > 1 else 2}"], steps, echo)
    data_vocab = None
    if full["vocab"] != full["data vocab"]:
        data_vocab = run_probe(config, overrides + [f"model.vocab_size={full['data vocab']}"], steps, echo)
    return {"probes": {"full": full, "other depth": depth, "data vocabulary": data_vocab},
            "terms": breakdown(full, depth, data_vocab), "peak": full["peak"], "device": full["device"]}


def planned_terms(cfg):
    """The planner's terms for the same config on one device of this kind, by breakdown name (bytes)."""
    from ms_llm.parallel import planner
    from ms_llm.parallel.layout import layout_from_config
    from ms_llm.parallel.memory import planned_by_kind
    from ms_llm.parallel.shapes import ModelShape
    from ms_llm.train.setup.context import device_target

    target = device_target(cfg.context)
    layout, devices = layout_from_config(cfg, 1, target="CPU" if target == "CPU" else "Ascend")
    shape = ModelShape.from_config(cfg.model)
    _, result = planner.plan(cfg, planner.Cluster(devices=devices), layout)
    stage = result["memory"]["stages"][result["memory"]["peak_stage"]]
    kinds = planned_by_kind(stage["terms"])
    return {name: kinds.get(kind) for name, kind in PLANNED.items()}, result["memory"]["peak_bytes"], shape


def format_breakdown(r, plan=None, plan_peak=None):
    rows = [f"memory breakdown: peak {r['peak'] / MIB:,.0f} MiB on {r['device']} (measured; parts sum to the peak)",
            f"  {'term':<32}{'measured MiB':>14}{'share':>8}{'planned MiB':>14}"]
    for name in TERMS:
        value = r["terms"][name]
        planned = (plan or {}).get(name)
        planned_txt = f"{planned / MIB:14,.0f}" if planned is not None else f"{'—':>14}"
        rows.append(f"  {name:<32}{value / MIB:14,.0f}{value / r['peak']:8.0%}{planned_txt}")
    rows.append(f"  {'peak':<32}{r['peak'] / MIB:14,.0f}{'':8}"
                + (f"{plan_peak / MIB:14,.0f}   planned / measured {plan_peak / r['peak']:.2f}" if plan_peak else ""))
    return "\n".join(rows)


def main(cfg_path, overrides, steps, as_json, echo=print):
    from ms_llm.config import load_config

    cfg = load_config(cfg_path, overrides)
    echo(f"benchmark --memory: {steps} steps in each of 2-3 fresh processes (the config, another depth, the "
         f"dataset's vocabulary)")
    r = measure(cfg_path, overrides, steps, echo)
    from dataclasses import replace

    cfg = replace(cfg, model=replace(cfg.model, vocab_size=r["probes"]["full"]["vocab"]))
    plan, plan_peak, _ = planned_terms(cfg)
    r["planned"] = {k: v for k, v in plan.items() if v is not None}
    r["planned peak"] = plan_peak
    echo(json.dumps(r) if as_json else format_breakdown(r, plan, plan_peak))
    return r


if __name__ == "__main__":
    probe_main(sys.argv[1:])

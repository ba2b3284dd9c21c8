"""The ladder's rungs as plain data: the plain config derived from a target, the options that differ, their order,
and the hardware each rung needs. Nothing here trains or imports MindSpore, so the derivation is tested on its own.

The plain rung is the target with `PLAIN`'s values: float32, no loss scaling, no fused CPU kernels, no recompute,
no compile cache, one process (the target's micro batch, accumulation carrying the global batch), no optimizer
sharding, synchronous checkpoints, one reader thread. Everything else (model, data, global batch, seed, schedule,
monitoring) is the target's. The rungs come from a diff of the two configs, flattened to dotted keys: each key that
differs belongs to one entry of `OPTIONS` (an option may span keys that are only valid together, e.g. pipeline
stages and their micro-batches), and a key no option claims becomes a rung of its own, named by the key, so nothing
is folded silently into another rung. Each rung adds one option to the rung before; the last rung is the target.

The order (docs/ladder.md): options that must not change a single number first, then those expected to move the
numbers within noise: fused kernels, fusion level, precision, then the parallel layout. An option is put after
the options it needs (`after`: sequence parallel needs tensor parallelism; a per-stage recompute list needs the
pipeline), and unknown keys go last.
"""
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from ms_llm.rundir.reader import flatten

EXACT, NOISE = "exact", "within noise"


@dataclass(frozen=True)
class Option:
    name: str  # the rung's name
    keys: Tuple[str, ...]  # the config keys the option sets (together: one rung)
    expect: str  # EXACT: must not change a single number; NOISE: may move them within the seed-to-seed band
    why: str  # why it is expected so (printed in the table's notes and docs/ladder.md)
    after: Tuple[str, ...] = ()  # options that must come first when they are in the ladder too
    after_if_list: Tuple[str, ...] = ()  # ... only when the option's value is a list (recompute per stage)


# The table of known options, in ladder order.
OPTIONS = (
    Option("compile_cache", ("context.compile_cache",), EXACT,
           "loads the graph it compiled before (the first step is checked against the one it was stored with)"),
    Option("async_save", ("checkpoint.async_save",), EXACT, "writes the same checkpoint from a background thread"),
    Option("data_workers", ("data.num_workers",), EXACT, "more reader threads deliver the same samples in order"),
    Option("recompute", ("recompute_config.recompute",), EXACT,
           "replays the same forward operations in the backward pass", after_if_list=("pipeline",)),
    Option("select_recompute", ("recompute_config.select_recompute",), EXACT,
           "replays attention core and MLP activation with the same operations"),
    Option("loss_scale", ("precision.loss_scale",), EXACT,
           "in float32 a power-of-two scale only moves exponents (another scale: within noise)"),
    Option("cpu_kernels", ("context.cpu_kernels",), NOISE,
           "the fused kernels reassociate sums (-ffast-math): last-bit differences"),
    Option("jit_level", ("context.jit_level",), NOISE, "graph-kernel fusion reorders floating-point operations"),
    Option("compute_dtype", ("precision.compute_dtype",), NOISE,
           "16-bit matmuls and activations round where float32 did not"),
    Option("data_parallel", ("parallel_config.data_parallel",), NOISE,
           "the all-reduce sums the ranks' gradients in another order than accumulation did"),
    Option("optimizer_shard", ("parallel_config.optimizer_shard",), NOISE,
           "sharded AdamW states, gathered by collective communication"),
    Option("model_parallel", ("parallel_config.model_parallel",), NOISE,
           "split matmuls are summed across ranks in another order"),
    Option("vocab_emb_dp", ("parallel_config.vocab_emb_dp",), NOISE,
           "a vocabulary-split embedding and head sum across ranks", after=("model_parallel",)),
    Option("seq_parallel", ("parallel_config.use_seq_parallel",), NOISE,
           "norms and residuals split along the sequence, reduce-scattered", after=("model_parallel",)),
    Option("pipeline", ("parallel_config.pipeline_stage", "parallel_config.micro_batch_num"), NOISE,
           "stages pass activations and sum micro-batch gradients in pipeline order (micro_batch_num comes with "
           "the stages: it must be 1 without a pipeline)"),
    Option("stage_layers", ("parallel_config.stage_layers",), NOISE,
           "another split of the layers over the stages", after=("pipeline",)),
)
UNKNOWN_WHY = "not in the ladder's table of known options: judged by the noise band, and named by its key"
UNKNOWN_ORDER = len(OPTIONS)


def _jit_plain(value, target):
    return "O0" if value in ("O1", "O2") else value  # no fusion level unless the target asks for one


def _cpu_kernels_plain(value, target):
    # the fused kernels exist on CPU only: a target set to run on Ascend or GPU would get a rung that changes nothing
    return value if target.get("context.device_target") in ("Ascend", "GPU") else False


# The plain rung: key -> plain value, or a function (target's value, whole flat target) -> plain value.
PLAIN: Dict[str, Any] = {
    "context.compile_cache": False,
    "checkpoint.async_save": False,
    "data.num_workers": 1,
    "recompute_config.recompute": False,
    "recompute_config.select_recompute": False,
    "precision.loss_scale": "none",
    "context.cpu_kernels": _cpu_kernels_plain,
    "context.jit_level": _jit_plain,
    "precision.compute_dtype": "float32",
    "parallel_config.data_parallel": 1,
    "parallel_config.optimizer_shard": False,
    "parallel_config.model_parallel": 1,
    "parallel_config.vocab_emb_dp": True,
    "parallel_config.use_seq_parallel": False,
    "parallel_config.pipeline_stage": 1,
    "parallel_config.micro_batch_num": 1,
    "parallel_config.stage_layers": None,
}

SEED_RUNG = "plain-seed2"  # the plain config at train.seed + 1: the seed-to-seed band
SAVES_PER_RUNG = 20  # checkpoints per rung (kept, all): one near any parting step, for the localisation dump


@dataclass
class Rung:
    index: int  # 0 = plain; the seed rung has -1
    name: str
    option: Optional[str]  # the option it adds (None: plain and the seed rung)
    keys: Tuple[str, ...]  # the keys it changes from the rung before
    expect: Optional[str]
    why: str
    config: dict  # the rung's whole config as nested sections (ready for yaml.safe_dump)
    added: Dict[str, Any] = field(default_factory=dict)  # key -> (value before, value now)
    unknown: bool = False

    @property
    def dir_name(self):
        return self.name if self.index < 0 else f"{self.index:02d}-{self.name}"

    @property
    def flat(self):
        return flatten(self.config)

    def label(self):
        if not self.added:
            return "plain" if self.index == 0 else "plain, train.seed + 1 (the noise band)"
        return ", ".join(f"{k}: {show(a)} → {show(b)}" for k, (a, b) in self.added.items())


def unflatten(flat):
    out = {}
    for key, v in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


def show(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def economy(target, steps):
    """What every rung (the target's own included) is given: N steps of the target's own schedule, a log record
    per step, checkpoints near any step (kept, for the localisation dump), an evaluation at the end only, and
    nothing sent to remote storage. Returns ({key: value}, [notes])."""
    t, notes = target["train"], []
    save = max(1, steps // SAVES_PER_RUNG)
    decay = t.get("decay_steps")
    if decay is None and t["max_steps"] > t["warmup_steps"]:
        decay = t["max_steps"]  # the target's cosine/linear decay, of which the ladder trains the first N steps
    fixed = {"train.max_steps": steps, "train.stop_at_step": None, "train.decay_steps": decay,
             "train.log_interval": 1, "train.eval_interval": 0, "checkpoint.save_interval": save,
             "checkpoint.keep_last": steps // save + 1, "checkpoint.auto_resume": False,
             "checkpoint.remote_dir": None, "checkpoint.uploader": None, "checkpoint.strategy_dir": None,
             "monitor.progress_bar": False}
    if target["parallel_config"].get("data_parallel") is None:
        fixed["parallel_config.data_parallel"] = 1
        notes.append("parallel_config.data_parallel is null (the launch decides it): the ladder runs the target as "
                     "one data-parallel rank; set data_parallel: N in the config to ladder an N-rank target")
    if steps < t["warmup_steps"]:
        notes.append(f"the first {steps} steps are all warm-up (train.warmup_steps = {t['warmup_steps']}): the "
                     f"ladder compares the target's own schedule, at small learning rates")
    return fixed, notes


def plain_flat(target_flat):
    out = dict(target_flat)
    for key, rule in PLAIN.items():
        if key in out:
            out[key] = rule(out[key], target_flat) if callable(rule) else rule
    return out


def option_of(key):
    return next((o for o in OPTIONS if key in o.keys), None)


def is_power_of_two(x):
    return isinstance(x, (int, float)) and x > 0 and math.log2(x) == int(math.log2(x))


def expectation(option, target_flat):
    """The verdict an option is held to. A loss scale is exact only when every scale it can take is a power of
    two (its initial scale and, dynamic, the factor it grows and backs off by)."""
    if option.name == "loss_scale":
        scales = [target_flat.get("precision.init_scale")]
        if target_flat.get("precision.loss_scale") == "dynamic":
            scales.append(target_flat.get("precision.scale_factor"))
        return EXACT if all(is_power_of_two(s) for s in scales) else NOISE
    return option.expect


def ladder_options(plain, target):
    """[(Option, keys)] for the keys that differ, in ladder order; a key no option claims is an Option of its own."""
    differ = sorted(k for k in set(plain) | set(target) if plain.get(k, "(absent)") != target.get(k, "(absent)"))
    found, unknown = {}, []
    for key in differ:
        opt = option_of(key)
        if opt is None:
            unknown.append(Option(key, (key,), NOISE, UNKNOWN_WHY))
        else:
            found.setdefault(opt.name, (opt, []))[1].append(key)
    ordered, pending = [], [found[o.name] for o in OPTIONS if o.name in found]
    present = set(found)
    while pending:  # table order, each option after the ones it needs
        for i, (opt, keys) in enumerate(pending):
            needs = set(opt.after) | (set(opt.after_if_list) if isinstance(target.get(opt.keys[0]), list) else set())
            if not (needs & present) - {o.name for o, _ in ordered}:
                ordered.append(pending.pop(i))
                break
        else:  # a cycle cannot occur in OPTIONS; this keeps a bad edit from looping forever
            ordered.append(pending.pop(0))
    return [(o, tuple(sorted(k, key=o.keys.index))) for o, k in ordered] + [(o, o.keys) for o in unknown]


def plan_rungs(target_config, steps):
    """(rungs, notes) for a target config given as nested sections (ms_llm.config.to_dict of the loaded config).
    rungs[0] is plain, rungs[-1] the target; the seed rung is returned separately by `seed_rung`."""
    target = dict(flatten(target_config))
    fixed, notes = economy(target_config, steps)
    target.update(fixed)
    plain = plain_flat(target)
    rungs = [Rung(0, "plain", None, (), None, "", unflatten(plain))]
    current = dict(plain)
    for i, (opt, keys) in enumerate(ladder_options(plain, target), 1):
        added = {k: (current.get(k), target.get(k)) for k in keys}
        current = dict(current)
        for k in keys:
            current[k] = target[k]
        unknown = option_of(keys[0]) is None
        rungs.append(Rung(i, opt.name, opt.name, keys,
                          expectation(opt, target), opt.why, unflatten(current), added, unknown))
    return rungs, notes


def seed_rung(plain):
    flat = plain.flat
    flat["train.seed"] = flat["train.seed"] + 1
    return Rung(-1, SEED_RUNG, None, ("train.seed",), None, "the plain config at another seed: the noise band",
                unflatten(flat), {"train.seed": (plain.flat["train.seed"], flat["train.seed"])})


# --- the hardware a rung needs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Machine:
    device: str  # what this MindSpore runs on: CPU, GPU, Ascend
    cores: int
    msrun: bool


def world_size(flat):
    return ((flat.get("parallel_config.data_parallel") or 1) * flat.get("parallel_config.model_parallel", 1)
            * flat.get("parallel_config.pipeline_stage", 1))


def missing_hardware(flat, machine):
    """Why this machine cannot run a rung with this config, or None."""
    want = flat.get("context.device_target", "auto")
    if want not in ("auto", machine.device):
        return f"context.device_target is {want}; this machine runs MindSpore on {machine.device}"
    semi = (flat.get("parallel_config.model_parallel", 1) > 1 or flat.get("parallel_config.pipeline_stage", 1) > 1
            or flat.get("parallel_config.optimizer_shard"))
    if semi and machine.device == "CPU":
        return ("tensor/pipeline parallelism and optimizer sharding run in MindSpore's semi-auto parallel mode, "
                "which needs Ascend or GPU devices")
    ranks = world_size(flat)
    if ranks > 1 and not machine.msrun:
        return f"{ranks} ranks need msrun, which is not on PATH"
    if ranks > 1 and machine.device == "CPU" and ranks > machine.cores:
        return f"{ranks} msrun ranks on {machine.cores} CPU core(s): each rank needs a core of its own"
    return None


def train_command(config_path, run_dir, ranks, resume=False, local=True, log_dir=None, port=8118, train_py=None):
    """The command that trains one rung: `ms-llm train` for one rank, msrun + train.py for several."""
    tail = ["--config", config_path, "--run-dir", run_dir] + (["--resume"] if resume else [])
    if ranks == 1:
        return ["ms-llm", "train"] + tail
    return (["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}", f"--master_port={port}", "--join=True"]
            + (["--cluster_time_out=300"] if local else [])
            + [f"--log_dir={log_dir or os.path.join(os.path.dirname(run_dir), 'msrun_logs')}",
               train_py or "train.py"] + tail)


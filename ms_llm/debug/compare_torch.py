"""`ms-llm debug compare-torch`: a Hugging Face model in ms_llm against its PyTorch original, module by module,
forward and backward, and through one optimizer step.

The checkpoint is loaded twice: into transformers' PyTorch model (float32, CPU) and into ms_llm through the
checkpoint converter (ms_llm.interop.huggingface), in the compute dtype asked for. Both see the same (B, T+1)
token batch. PyTorch's side is a dump (ms_llm.interop.torch_dump.dump_module: every module's output, every
parameter's gradient), made here or brought with --reference-dump from wherever the original runs. ms_llm's
module outputs come from its probe (PyNative, a hook on every Cell: ms_llm.debug.probe); its loss, gradients and
update from the training step itself (ms_llm.train.step.TrainStep in the context's mode, graph by default: loss
scale, clipping and AdamW as training runs them). torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW (decay on
matrices only, our rule) take the same gradients, so the rows of the weights after the step check the optimizer
mapping alone.

Rows, in execution order: every compared module's output (ms_llm.interop.hf_modules names the transformers
module of each), the loss, every parameter's gradient in reverse order, and every parameter after the step.
Errors are those of `ms-llm compare` (ms_llm.debug.compare.errors): max abs, max abs relative to the reference's
largest magnitude, cosine. A row is over tolerance when its relative error exceeds TOLERANCES[compute dtype][kind]
or a value is non-finite.
"""
import datetime
import json
import os
import time
from dataclasses import replace

import numpy as np

from ms_llm.errors import UserError
from ms_llm.interop.hf_modules import MODULES, module_pairs
from ms_llm.interop.torch_dump import INSTALL_HINT, batch_sha256, random_batch, read_dump

# Max error relative to the reference's largest magnitude, per ms_llm compute dtype and row kind (PyTorch always
# float32). Derived by benchmarks/compare_torch_tolerances.py, which re-derives this table from 2 families x 2 sizes
# x 5 seeds (docs/debugging.md, "Tolerances"): float32 = 10 x the largest float32 error (two implementations'
# drift); float16 / bfloat16 = that band + 10 x the float16 errors counted in float16 rounding units (3.9 forward,
# 4.6 gradient) x the dtype's unit roundoff; the weights after the step keep the float32 band (float32 masters,
# both optimizers given the same gradients).
TOLERANCES = {
    "float32": {"forward": 2e-05, "loss": 4e-06, "gradient": 2e-05, "weight": 5e-06},
    "float16": {"forward": 0.02, "loss": 9e-05, "gradient": 0.03, "weight": 5e-06},
    "bfloat16": {"forward": 0.2, "loss": 0.0007, "gradient": 0.2, "weight": 5e-06},
}
BF16_ON_CPU = ("--compute-dtype bfloat16 cannot run on CPU: MindSpore's CPU MatMul kernel has no bfloat16 version "
               "(the forward stops with \"Select CPU operator[MatMul] fail! Unsupported data type\"), so ms_llm's "
               "bfloat16 model cannot be run here. Run the comparison on Ascend, where bfloat16 is native (PyTorch "
               "stays float32 on the host CPU), or compare float16 here (--compute-dtype float16): it shows where "
               "half precision loses accuracy, with a finer rounding unit (2^-11 against bfloat16's 2^-8).")


# --- inputs -----------------------------------------------------------------------------------------------

def supported():
    return ", ".join(sorted(MODULES))


def read_checkpoint(hf_dir):
    """(config.json dict, our model section, {HF name: float32 array}) through the converter; refuses families
    the module table does not know before reading any weights."""
    from ms_llm.interop import huggingface as hf

    if not os.path.isdir(hf_dir):
        raise UserError(f"--hf '{hf_dir}' is not a folder. Give a Hugging Face model folder (config.json + "
                        f"*.safetensors), e.g. one written by save_pretrained.")
    hf_cfg = hf.read_hf_config(hf_dir)
    kind = hf_cfg.get("model_type")
    if kind not in MODULES:
        raise UserError(f"--hf '{hf_dir}' holds a model of model_type {kind!r}, which compare-torch does not "
                        f"support. Supported model_types: {supported()} (those the checkpoint converter, ms-llm "
                        f"convert, reads). Compare another architecture by dumping it with "
                        f"ms_llm.interop.torch_dump.dump_module and a name map onto an ms_llm model of the same "
                        f"computation.")
    _, section = hf.hf_model_section(hf_dir)
    tensors, _ = hf.read_hf_tensors(hf_dir)
    return hf_cfg, section, tensors


def build_config(section, config=None, overrides=(), compute_dtype=None):
    """The model section from the checkpoint, everything else (train.lr, clip_grad, weight_decay, betas, eps,
    precision, context) from `config` (a training YAML) or the defaults, then --set overrides."""
    from ms_llm.config import config_from_dict
    from ms_llm.config.loader import read_yaml

    raw = read_yaml(config) if config else {}
    raw["model"] = dict(section)
    raw.setdefault("train", {})
    cfg = config_from_dict(raw, overrides)
    if compute_dtype:
        cfg = replace(cfg, precision=replace(cfg.precision, compute_dtype=compute_dtype))
    return cfg


def load_name_map(path):
    import yaml

    if not os.path.isfile(path):
        raise UserError(f"--name-map '{path}' does not exist. Give a YAML file of 'their name: ms_llm name' lines.")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise UserError(f"--name-map '{path}' is not valid YAML ({getattr(e, 'problem', e)}). It holds 'their "
                        f"name: ms_llm name' lines, e.g. 'blocks.{{i}}.attn: layers.{{i}}.attention'.") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise UserError(f"--name-map '{path}' must be a mapping of their module/parameter names to ms_llm's "
                        f"('blocks.{{i}}.attn: layers.{{i}}.attention'), got {type(raw).__name__}.")
    return raw


def make_batch(vocab_size, max_positions, batch_size, seq_length, seed, data):
    """(B, T+1) int32 tokens: random ones (torch_dump.random_batch, reproducible anywhere) or the first
    validation batch of a dataset; and a description of where they came from."""
    if batch_size < 1 or (seq_length is not None and seq_length < 1):
        raise UserError(f"--batch-size {batch_size} and --seq-length {seq_length} must be positive integers.")
    if seq_length is not None and seq_length > max_positions:
        raise UserError(f"--seq-length {seq_length} is longer than the model's {max_positions} positions "
                        f"(config.json). Pass --seq-length <= {max_positions}.")
    if data is None:
        t = seq_length or min(32, max_positions)
        return random_batch(vocab_size, batch_size, t, seed), f"random tokens (seed {seed})"
    from ms_llm.data.loader import check_token_ids, eval_batches
    from ms_llm.data.manifest import load_manifest

    manifest = load_manifest(data)
    t = seq_length or min(manifest["seq_length"], max_positions)
    if t > manifest["seq_length"] or t > max_positions:
        limit = min(manifest["seq_length"], max_positions)
        raise UserError(f"--seq-length {t}: the samples of '{data}' hold {manifest['seq_length']} tokens and the "
                        f"model {max_positions} positions. Pass --seq-length <= {limit}.")
    batches = eval_batches(data, manifest, batch_size, 1, seq_length=t)
    if not batches:
        raise UserError(f"'{data}' has fewer than {batch_size} validation samples. Pass a smaller --batch-size.")
    batch = batches[0].asnumpy().astype(np.int32)
    problem = check_token_ids(batch, vocab_size)
    if problem:
        raise UserError(f"--data '{data}' does not fit the model's vocabulary: {problem}")
    return batch, f"the first validation batch of {data}"


def import_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise UserError(f"compare-torch runs the Hugging Face model in PyTorch, and {e.name or 'torch'} is not "
                        f"installed: {INSTALL_HINT}. Or compare a dump made elsewhere with --reference-dump DIR "
                        f"(ms_llm.interop.torch_dump.dump_module), which needs neither.") from None


# --- the two sides ----------------------------------------------------------------------------------------

def run_transformers(hf_dir, batch, modules, out_dir):
    """transformers' model in float32 on CPU, and its dump (written to out_dir). Returns (model, index, forward,
    grads); the model is kept for the optimizer step (torch_step)."""
    import torch
    import transformers

    from ms_llm.interop.torch_dump import dump_module

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).float()  # bfloat16 checkpoints widen exactly
    dump_module(model, batch, out_dir, modules=modules)
    index, forward, grads = read_dump(out_dir)
    index["framework"] = f"transformers {transformers.__version__}, torch {torch.__version__}"
    return model, index, forward, grads


def torch_step(model, grads, t):
    """One step of torch's own optimizer on `grads` ({parameter name: array}): clip_grad_norm_, then
    torch.optim.AdamW with weight decay on matrices only (our rule). Returns {parameter name: value after}."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    for name, p in model.named_parameters():
        p.grad = torch.tensor(np.asarray(grads[name], dtype=np.float32)) if p.requires_grad else None  # a copy:
        # clip_grad_norm_ scales in place
    if t.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(params, t.clip_grad)
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps).step()
    return {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}


def run_ms_llm(cfg, arrays, batch, target):
    """ms_llm's model with the converted weights. Module outputs come from the probe (PyNative: hooks need it);
    the loss, the gradients and the update from the training step itself (TrainStep, in the context's mode),
    run with accumulation 2 over the batch twice: the first micro-batch leaves its gradients (of loss x loss
    scale / 2) in the step's accumulation buffers, where they are read, and the second adds the same again
    before clipping and AdamW. So the gradients compared, the gradients torch's optimizer is given and those
    ms_llm's step applies are the same numbers, and the rows of the weights after the step see the two
    optimizers alone."""
    import mindspore as ms

    from model_zoo import build_model, weights
    from ms_llm.debug.probe import trace_forward
    from ms_llm.nn import backend as nn_backend
    from ms_llm.train.losses import TokenLoss
    from ms_llm.train.optimizer import AdamW
    from ms_llm.nn.dropout import KEY_NAME
    from ms_llm.train.step import StepSpec, TrainStep

    p, t = cfg.precision, cfg.train
    backend = nn_backend.for_device(target, cfg.context.cpu_kernels)
    ms.set_seed(t.seed)
    model = build_model(cfg.model, p.compute_dtype, backend)
    for name, param in weights(model).items():
        param.set_data(ms.Tensor(arrays[name]).astype(param.dtype))
    model.set_train(True)
    ids = ms.Tensor(batch)
    forward = {}
    for name, _, _, arr in trace_forward(model, ids, keep=True):
        forward.setdefault(name, arr)
    params = model.trainable_params()
    before = {q.name: q.asnumpy().copy() for q in params}
    step = TrainStep(AdamW(params, t.beta1, t.beta2, t.eps, t.weight_decay), TokenLoss(model),
                     StepSpec(p, t.clip_grad, np.array([t.lr], np.float32), accum=2,
                              dropout_key=getattr(model, KEY_NAME, None), backend=backend))
    scale = float(step.state.loss_scale.asnumpy())
    loss = float(step.accumulate(ids).asnumpy())
    grads = {q.name: b.asnumpy() * np.float32(2 / scale) for q, b in zip(params, step.state.grad_buffers)}
    step.accumulate(ids)  # the same batch again: the step's gradient is the batch's (2 micro-batches of it ÷ 2)
    _, grad_norm, code, _ = step()
    after = {q.name: q.asnumpy().copy() for q in params}
    read_norm = float(np.sqrt(sum(float(np.square(g, dtype=np.float64).sum()) for g in grads.values())))
    return {"forward": forward, "loss": loss, "grads": grads, "order": [q.name for q in params], "before": before,
            "after": after, "grad_norm": float(grad_norm.asnumpy()), "read_grad_norm": read_norm,
            "step_code": int(code.asnumpy())}


# --- matching names -------------------------------------------------------------------------------------

def hf_sources(tensors, m, prefix):
    """{our parameter: 'their tensor[ + ...]'}: which checkpoint tensors the converter builds each of ours from,
    found by converting one-element stand-ins that carry their tensor's number (the converter only moves values)."""
    from ms_llm.interop.huggingface import hf_to_ours

    names = sorted(tensors)
    try:
        tags = hf_to_ours({n: np.full((1,) * np.ndim(tensors[n]), i, np.float32) for i, n in enumerate(names)},
                          m, prefix)
    except Exception:  # noqa: BLE001 (a converter that reshapes cannot take stand-ins: names are cosmetic)
        return {}
    return {ours: joined([names[int(i)] for i in dict.fromkeys(np.asarray(a).ravel().tolist())])
            for ours, a in tags.items()}


def joined(names):
    """'a.b.{q_proj,k_proj}.weight' for names that differ in one dotted part; else 'x + y'."""
    if len(names) == 1:
        return names[0]
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) == 1:
        differ = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        if len(differ) == 1:
            i = differ[0]
            return ".".join(parts[0][:i] + ["{" + ",".join(p[i] for p in parts) + "}"] + parts[0][i + 1:])
    return " + ".join(names)


def reference_in_our_names(cfg, model_type, tensors, prefix, index, forward, grads, name_map):
    """The reference dump's module outputs and gradients under our names: through a name map (given, or applied
    when the dump was made), or, for a dump in transformers' names, through the module table and the converter.
    Returns (forward, grads, {our name: their name}); anything unmatched or mis-shaped is refused."""
    from ms_llm.interop.huggingface import hf_to_ours
    from ms_llm.interop.torch_dump import apply_name_map

    m = cfg.model
    pairs = module_pairs(model_type, m.num_layers)
    theirs = {}
    if name_map or index.get("names") == "ms_llm":
        if name_map:
            f_ours, fsrc = apply_name_map(forward, dict(name_map, logits="logits"))
            g_ours, gsrc = apply_name_map(grads, name_map)
            sources = {**fsrc, **gsrc}
            used = {n for names in sources.values() for n in names}
        else:
            f_ours, g_ours, sources = forward, grads, index.get("their_names", {})
            used = set(forward) | set(grads)
        theirs = {k: joined(v) for k, v in sources.items()}
        missing = [o for o, _ in pairs if o not in f_ours]
        missing += [n for n in param_shapes(cfg) if n not in g_ours]
        if missing:
            unused = [n for n in list(forward) + list(grads) if n not in used]
            how = "--name-map" if name_map else "the name map the dump was made with"
            raise UserError(f"{how} leaves {len(missing)} ms_llm module(s)/parameter(s) unmatched: "
                            f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}. Map each to the "
                            f"dump's name ('their name: ms_llm name', {{i}} for the layer); dump entries no entry "
                            f"matched: {', '.join(unused[:20]) or 'none'}{' ...' if len(unused) > 20 else ''}.")
        return f_ours, g_ours, theirs
    # a dump in transformers' names
    missing_modules = [f"{o} ({t})" for o, t in pairs if t not in forward]
    needed = [n for n in tensors if n in transformers_parameters(tensors, m, prefix)]
    missing_params = [n for n in needed if n not in grads]
    if missing_modules or missing_params:
        raise UserError(f"the reference dump does not hold {len(missing_modules) + len(missing_params)} output(s)/"
                        f"gradient(s) under the names transformers gives this {model_type} model: "
                        f"{', '.join((missing_modules + missing_params)[:20])}"
                        f"{' ...' if len(missing_modules) + len(missing_params) > 20 else ''}. If it comes from your "
                        f"own PyTorch model, pass --name-map M.yaml mapping its names to ms_llm's (their name: "
                        f"ms_llm name); its names start with: {', '.join(list(forward)[:8])}.")
    bad = [f"{n}: reference dump {tuple(grads[n].shape)}, checkpoint {tuple(np.shape(tensors[n]))}" for n in needed
           if tuple(grads[n].shape) != tuple(np.shape(tensors[n]))]
    if bad:
        raise UserError("the reference dump's gradients do not have the checkpoint's shapes, so it was made with "
                        "another model: " + "; ".join(bad[:10]) + (" ..." if len(bad) > 10 else "")
                        + ". Dump the model whose weights are in --hf.")
    f_ours = {o: forward[t] for o, t in pairs}
    theirs = dict(pairs)
    g_ours = hf_to_ours({n: grads[n] for n in needed}, m, prefix)
    theirs.update(hf_sources(tensors, m, prefix))
    return f_ours, g_ours, theirs


def transformers_parameters(tensors, m, prefix):
    """The checkpoint tensors the converter reads (buffers and a tied head left out), recorded while it converts
    stand-ins: one-element arrays, or zero-copy views of the full shapes for a converter that reshapes."""
    from ms_llm.interop.huggingface import hf_to_ours

    seen = set()

    class Recorder(dict):
        def __getitem__(self, k):
            seen.add(k)
            return dict.__getitem__(self, k)

    try:
        hf_to_ours(Recorder({n: np.zeros((1,) * np.ndim(a), np.float32) for n, a in tensors.items()}), m, prefix)
    except Exception:  # noqa: BLE001
        seen.clear()
        hf_to_ours(Recorder({n: np.broadcast_to(np.float32(0), np.shape(a)) for n, a in tensors.items()}), m, prefix)
    return seen


def param_shapes(cfg):
    from mindspore.nn.utils import no_init_parameters

    from model_zoo import build_model

    with no_init_parameters():
        return {n: tuple(p.shape) for n, p in build_model(cfg.model).parameters_and_names()}


# --- the comparison -------------------------------------------------------------------------------------

def compare_rows(ours, ref_forward, ref_grads, ref_loss, ref_after, theirs, dtype):
    from ms_llm.debug.compare import errors

    tol = TOLERANCES[dtype]
    band = TOLERANCES["float32"]
    rows = []

    def add(kind, name, a, b, their_name):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise UserError(f"{kind} {name}: ms_llm's shape {a.shape} differs from the reference's {b.shape} "
                            f"({their_name}): the reference was made with another model or batch.")
        e = errors(a, b)
        bad = lambda limit: not (e["max_rel"] <= limit)  # noqa: E731 (NaN and inf are over)
        rows.append({"kind": kind, "ours": name, "theirs": their_name, "shape": list(a.shape), **e,
                     "tol": tol[kind], "over": bad(tol[kind]), "over_fp32_band": bad(band[kind])})

    order = [n for n in ours["forward"] if n in ref_forward]  # our execution order
    for name in order:
        add("forward", name, ours["forward"][name], ref_forward[name], theirs.get(name, name))
    add("loss", "loss", ours["loss"], ref_loss, "cross-entropy of the logits")
    for name in reversed(ours["order"]):
        add("gradient", name, ours["grads"][name], ref_grads[name], theirs.get(name, name))
    if ref_after is not None:
        for name in ours["order"]:
            add("weight", name, ours["after"][name], ref_after[name], theirs.get(name, name))
    return rows


def label(row):
    return {"forward": row["ours"], "loss": row["ours"], "gradient": f"grad {row['ours']}",
            "weight": f"after step {row['ours']}"}[row["kind"]]


def compare_torch(hf_dir, batch_size=2, seq_length=None, seed=0, data=None, compute_dtype=None, output_dir=None,
                  reference_dump=None, name_map_path=None, config=None, overrides=(), log=None):
    """Run the comparison; returns the result dict (also written to OUTPUT/compare.json, plotted in
    OUTPUT/compare.html)."""
    from ms_llm.train.setup.context import setup_context

    log = log or (lambda msg: print(msg, flush=True))
    hf_cfg, section, tensors = read_checkpoint(hf_dir)
    model_type = hf_cfg["model_type"]
    cfg = build_config(section, config, overrides, compute_dtype)
    dtype = cfg.precision.compute_dtype
    if name_map_path and not reference_dump:
        raise UserError("--name-map renames a reference dump's entries: it needs --reference-dump DIR. Without a "
                        "dump, compare-torch runs transformers' model, whose names it knows.")
    name_map = load_name_map(name_map_path) if name_map_path else None
    ref_index = None
    if reference_dump:
        if not os.path.isfile(os.path.join(reference_dump, "index.json")):
            raise UserError(f"--reference-dump '{reference_dump}' is not a dump (no index.json). Make one with "
                            f"ms_llm.interop.torch_dump.dump_module(model, input_ids, '{reference_dump}').")
        with open(os.path.join(reference_dump, "index.json"), encoding="utf-8") as f:
            ref_index = json.load(f)
    else:
        import_torch()
    out = output_dir or os.path.join("compare_torch", f"{os.path.basename(os.path.normpath(hf_dir))}-{dtype}-"
                                     f"{datetime.datetime.now():%Y%m%d-%H%M%S}")
    if os.path.exists(os.path.join(out, "compare.json")):
        raise UserError(f"--output-dir '{out}' already holds a comparison (compare.json). Choose another folder; "
                        f"nothing was overwritten.")
    m = cfg.model
    batch, source = make_batch(m.vocab_size, m.seq_length, batch_size, seq_length, seed, data)
    digest = batch_sha256(batch)
    if ref_index is not None and ref_index.get("batch_sha256") != digest:
        shape = ref_index.get("batch_shape")
        raise UserError(f"--reference-dump '{reference_dump}' was made on another token batch: its batch_sha256 "
                        f"{str(ref_index.get('batch_sha256'))[:16]}... (shape {shape}) differs from this comparison's "
                        f"{digest[:16]}... ({batch.shape[0]} x {batch.shape[1] - 1} tokens, {source}). Dump with "
                        f"input_ids = ms_llm.interop.torch_dump.random_batch({m.vocab_size}, {batch.shape[0]}, "
                        f"{batch.shape[1] - 1}, seed={seed}), or rerun compare-torch with the --batch-size, "
                        f"--seq-length, --seed (or --data) the dump's batch came from (the dump keeps it in "
                        f"batch.npy).")
    rt = setup_context(cfg.context)
    if dtype == "bfloat16" and rt.device_target == "CPU":
        raise UserError(BF16_ON_CPU)

    from ms_llm.interop import huggingface as hf

    prefix = hf.detect_prefix(tensors, m.arch)
    arrays = hf.hf_to_ours(tensors, m, prefix)
    hf.check_shapes(cfg, arrays)
    if reference_dump:  # names and shapes are checked before anything is written
        ref_index, ref_forward, ref_grads = read_dump(reference_dump)
        f_ref, g_ref, theirs = reference_in_our_names(cfg, model_type, tensors, prefix, ref_index, ref_forward,
                                                      ref_grads, name_map)
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "batch.npy"), batch)
    t = cfg.train
    log(f"compare-torch: {model_type} ({m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}) from "
        f"{hf_dir}; batch {batch.shape[0]} x {batch.shape[1] - 1} tokens, {source}")
    torch_model = None
    started = time.perf_counter()
    ref_dir = reference_dump
    if not reference_dump:
        ref_dir = os.path.join(out, "reference")
        log(f"[1/2] transformers: forward and backward in float32 on CPU → {ref_dir}")
        needed = [th for _, th in module_pairs(model_type, m.num_layers)]
        torch_model, ref_index, ref_forward, ref_grads = run_transformers(hf_dir, batch, needed, ref_dir)
        f_ref, g_ref, theirs = reference_in_our_names(cfg, model_type, tensors, prefix, ref_index, ref_forward,
                                                      ref_grads, name_map)
    log(f"{'' if reference_dump else '[2/2] '}ms_llm {dtype}: module outputs (PyNative), then one training step in "
        f"{cfg.context.mode} mode" + (" (compiling two graphs takes about a minute on CPU)"
                                      if cfg.context.mode == "graph" else "")
        + f"; {time.perf_counter() - started:.0f} s so far")
    ours = run_ms_llm(cfg, arrays, batch, rt.device_target)
    ref_after = None
    if torch_model is not None:  # both optimizers get ms_llm's gradients: the step rows see the optimizers alone
        origin = {"prefix": prefix, "has_lm_head": "lm_head.weight" in tensors}
        after = torch_step(torch_model, hf.ours_to_hf(ours["grads"], m, origin), t)
        ref_after = hf.hf_to_ours({n: after[n] for n in transformers_parameters(tensors, m, prefix)}, m, prefix)
    rows = compare_rows(ours, f_ref, g_ref, ref_index["loss"], ref_after, theirs, dtype)
    first = next((r for r in rows if r["over"]), None)
    first_band = next((r for r in rows if r["over_fp32_band"]), None)
    worst = max(rows, key=lambda r: r["max_rel"] if np.isfinite(r["max_rel"]) else np.inf)
    import mindspore as ms

    result = {
        "hf_dir": os.path.abspath(hf_dir), "model_type": model_type, "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "vocab_size": m.vocab_size, "compute_dtype": dtype,
        "device": rt.device_target, "mode": cfg.context.mode, "mindspore": ms.__version__,
        "reference": {"dir": os.path.abspath(ref_dir), "framework": ref_index.get("framework"),
                      "compute_dtype": ref_index.get("compute_dtype"), "names": ref_index.get("names", "own"),
                      "made_here": not reference_dump},
        "batch": {"shape": list(batch.shape), "sha256": digest, "source": source, "seed": seed},
        "optimizer": {"lr": t.lr, "beta1": t.beta1, "beta2": t.beta2, "eps": t.eps, "weight_decay": t.weight_decay,
                      "clip_grad": t.clip_grad, "loss_scale": cfg.precision.loss_scale,
                      "compared": not reference_dump, "grad_norm": ours["grad_norm"],
                      "read_grad_norm": ours["read_grad_norm"], "step_code": ours["step_code"]},
        "tolerances": TOLERANCES[dtype], "float32_band": TOLERANCES["float32"], "rows": rows,
        "first_over": {k: first[k] for k in ("kind", "ours", "theirs")} if first else None,
        "first_over_float32_band": {k: first_band[k] for k in ("kind", "ours", "theirs")} if first_band else None,
        "largest_relative_error": {"kind": worst["kind"], "ours": worst["ours"], "max_rel": worst["max_rel"]},
        "exit_code": 1 if first else 0,
    }
    result["output_dir"] = os.path.abspath(out)
    with open(os.path.join(out, "compare.json"), "w", encoding="utf-8") as f:
        json.dump(jsonable(result), f, indent=1)
    from ms_llm.debug.compare_torch_page import write_page

    result["html"] = write_page(result, os.path.join(out, "compare.html"))
    return result


def jsonable(obj):
    """JSON has no NaN / Infinity: non-finite floats become strings."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


def format_result(r):
    ref = r["reference"]
    o = r["optimizer"]
    lines = [f"ms_llm {r['compute_dtype']} on {r['device']} (MindSpore {r['mindspore']}) vs {ref['framework']} "
             f"{ref['compute_dtype']}" + ("" if ref["made_here"] else f" (dump {ref['dir']})"),
             f"ms_llm's module outputs from PyNative hooks; its loss, gradients and step from the training step "
             f"({r['mode']} mode)",
             f"batch {r['batch']['shape'][0]} x {r['batch']['shape'][1] - 1} tokens, {r['batch']['source']}, sha256 "
             f"{r['batch']['sha256'][:16]}"]
    if o["compared"]:
        lines.append(f"one step, torch given ms_llm's gradients: clip {o['clip_grad']:g}, AdamW lr {o['lr']:g} betas "
                     f"({o['beta1']:g}, {o['beta2']:g}) eps {o['eps']:g}, weight decay {o['weight_decay']:g} on "
                     f"matrices;\n  loss scale {o['loss_scale']}; grad norm {o['grad_norm']:.6g}"
                     + ("" if o["step_code"] == 0 else f"; ms_llm SKIPPED the update (code {o['step_code']})"))
        if not abs(o["read_grad_norm"] - o["grad_norm"]) <= 1e-4 * o["grad_norm"]:  # the two micro-batches differed
            lines.append(f"note: the step's gradient norm {o['grad_norm']:.6g} is not the norm of the gradients read "
                         f"from its first micro-batch ({o['read_grad_norm']:.6g}): ms_llm's backward is not "
                         f"deterministic here, and the weights after the step carry that difference")
    else:
        lines.append("the reference dump holds no optimizer step: weights after the step are not compared")
    w = max(44, *(len(label(x)) for x in r["rows"]))
    wt = max(36, *(len(x["theirs"]) for x in r["rows"]))
    lines.append(f"  {'ms_llm':<{w}} {'reference':<{wt}}{'max abs':>11}{'max rel':>11}{'cosine':>11}{'tol':>9}")
    fp16 = r["compute_dtype"] != "float32"
    for x in r["rows"]:
        mark = "!" if x["over"] else ("~" if fp16 and x["over_fp32_band"] else " ")
        lines.append(f"{mark} {label(x):<{w}} {x['theirs']:<{wt}}{x['max_abs']:>11.3g}{x['max_rel']:>11.3g}"
                     f"{x['cosine']:>11.7f}{x['tol']:>9.0e}")
    worst = r["largest_relative_error"]
    lines.append(f"largest relative error: {worst['max_rel']:.3g} ({worst['kind']} {worst['ours']})")
    if fp16:
        b = r["first_over_float32_band"]
        lines.append("first module over the float32 band (~): " + (f"{b['ours']} ({b['theirs']})" if b else "none"))
    f = r["first_over"]
    lines.append(f"first module over tolerance: {label(f)} ({f['theirs']})" if f else "all modules within tolerance")
    lines.append(f"wrote compare.json, compare.html and batch.npy to {r['output_dir']}")
    return "\n".join(lines)

"""A PyTorch model's per-module outputs and per-parameter gradients, written in ms_llm's dump format.

This file imports only torch and numpy (torch lazily, inside `dump_module`), so it runs where the PyTorch
original lives, a GPU machine without MindSpore; copy it there on its own if ms_llm is not installed.

    from torch_dump import dump_module, random_batch           # or: from ms_llm.interop.torch_dump import ...
    ids = random_batch(vocab_size=50257, batch_size=2, seq_length=128, seed=0)  # what compare-torch draws
    dump_module(model, ids, "dumps/torch")                      # model(ids[:, :-1]) -> logits, loss vs ids[:, 1:]

    ms-llm debug compare-torch --hf HF_DIR --reference-dump dumps/torch --batch-size 2 --seq-length 128 --seed 0

The dump format, one for MindSpore and PyTorch dumps (`ms-llm debug dump` writes it too; docs/debugging.md):

    DIR/index.json   format ("ms_llm.dump/2"), framework, modules (names in execution order), parameters (names
                     in registration order), loss, compute_dtype, device, batch_sha256, batch_shape, names
                     ("ms_llm": ms_llm's names, "own": the model's own), their_names ({name: original names}
                     where a name map renamed entries), plus whatever the writer adds (step, run_dir, model)
    DIR/forward.npz  module name -> the module's output at its first call (a tuple's first tensor), and
                     "logits" -> the model's output
    DIR/grads.npz    parameter name -> gradient of the mean next-token cross-entropy on the batch
    DIR/batch.npy    the (B, T+1) int32 token batch; its SHA-256 is batch_sha256

A name map ({their name: ms_llm name}, "{i}" standing for a layer number on both sides) renames entries to
ms_llm's names; several parameters mapped to one name are concatenated along the first axis in the order of
the map (separate q/k/v projections onto ms_llm's fused qkv). Parameters keep torch.nn.Linear's (out, in)
layout, which is ms_llm's.
"""
import hashlib
import json
import os
import re

import numpy as np

FORMAT = "ms_llm.dump/2"
INSTALL_HINT = 'pip install -e ".[torch]" (or: pip install torch transformers)'


# --- the token batch: the same everywhere ----------------------------------------------------------------

def random_batch(vocab_size, batch_size, seq_length, seed=0):
    """(batch_size, seq_length + 1) int32 tokens in [0, vocab_size), drawn from SHA-256 of the seed: the same
    batch on every machine and numpy version (numpy's generators promise no stream across versions)."""
    n = batch_size * (seq_length + 1)
    blocks = (n * 4 + 31) // 32
    raw = b"".join(hashlib.sha256(f"ms_llm.random_batch/{seed}/{k}".encode()).digest() for k in range(blocks))
    words = np.frombuffer(raw[: n * 4], dtype="<u4").astype(np.int64)
    return (words % vocab_size).astype(np.int32).reshape(batch_size, seq_length + 1)


def batch_sha256(ids):
    """The hash every dump records: SHA-256 of the batch as C-ordered int32."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(ids), dtype=np.int32).tobytes()).hexdigest()


# --- name maps --------------------------------------------------------------------------------------------

def _pattern(name):
    return re.compile("^" + re.escape(name).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$")


def apply_name_map(entries, name_map):
    """({ms_llm name: array}, {ms_llm name: [their names]}) for the entries (their name -> array) that `name_map`
    matches; several sources of one name are concatenated along axis 0 in the map's order, then layer order."""
    patterns = [(k, _pattern(k), v) for k, v in name_map.items()]
    found = {}
    for name, array in entries.items():
        for rank, (_, pat, target) in enumerate(patterns):
            m = pat.match(name)
            if m:
                layer = int(m.group("i")) if "i" in pat.groupindex else -1
                ours = target.replace("{i}", str(layer)) if layer >= 0 else target
                found.setdefault(ours, []).append((rank, layer, name, array))
                break
    out, sources = {}, {}
    for ours, items in found.items():
        items.sort(key=lambda t: (t[0], t[1]))
        arrays = [t[3] for t in items]
        out[ours] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        sources[ours] = [t[2] for t in items]
    return out, sources


# --- writing and reading ------------------------------------------------------------------------------------

def write_dump(out_dir, forward, grads, batch, index):
    """Write a dump: `forward` / `grads` map names to arrays (forward in execution order), `index` holds the
    metadata (framework, loss, compute_dtype, device, ...). Returns the full index."""
    batch = np.ascontiguousarray(np.asarray(batch), dtype=np.int32)
    index = dict(index, format=FORMAT, modules=list(forward), parameters=list(grads),
                 batch_sha256=batch_sha256(batch), batch_shape=list(batch.shape))
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, "forward.npz"), **forward)
    np.savez(os.path.join(out_dir, "grads.npz"), **grads)
    np.save(os.path.join(out_dir, "batch.npy"), batch)
    with open(os.path.join(out_dir, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1, default=str)
    return index


def read_dump(path):
    """(index, {module: output}, {parameter: gradient}) of a dump folder (FileNotFoundError without index.json)."""
    with open(os.path.join(path, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    with np.load(os.path.join(path, "forward.npz")) as fw, np.load(os.path.join(path, "grads.npz")) as gr:
        forward, grads = {k: fw[k] for k in fw.files}, {k: gr[k] for k in gr.files}
    order = {n: i for i, n in enumerate(index.get("modules", []))}  # npz keeps no order: the index does
    forward = dict(sorted(forward.items(), key=lambda kv: order.get(kv[0], len(order))))
    return index, forward, grads


# --- the PyTorch side -------------------------------------------------------------------------------------

def _to_numpy(t):
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    return t.cpu().numpy().copy()


def _first_tensor(output):
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):  # transformers' ModelOutput is a dict
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for x in output:
            if isinstance(x, torch.Tensor):
                return x
    return None


def dump_module(model, input_ids, out_dir, name_map=None, modules=None):
    """Run `model` forward and backward on `input_ids` and write the dump to `out_dir`; returns its index.

    input_ids: (B, T+1) token ids (a tensor or array): the model sees ids[:, :-1], the loss is the mean
    cross-entropy of its logits (the output, or output.logits, or the output's first tensor) against ids[:, 1:].
    Every named module gets a forward hook (its first call's output is kept); `modules` restricts that to the
    names given. The model runs in eval mode (dropout off, like ms_llm's comparison) and is put back in its mode
    after. The gradients stay in each parameter's .grad, so an optimizer step can follow.
    name_map: {their name: ms_llm name} (see the module docstring); then only mapped entries are written.
    """
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise ImportError(f"dump_module needs PyTorch: {INSTALL_HINT}") from None

    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    ids = torch.as_tensor(np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids),
                          dtype=torch.long, device=device)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must be (batch, seq_length + 1) token ids, got shape {tuple(ids.shape)}")
    keep = None if modules is None else set(modules)
    outputs = {}

    def hook(name):
        def fn(module, inputs, output):
            if name not in outputs:
                t = _first_tensor(output)
                if t is not None:
                    outputs[name] = _to_numpy(t)
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if n and (keep is None or n in keep)]
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    try:
        out = model(ids[:, :-1])
        logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if logits is None:
            logits = _first_tensor(out)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    forward = dict(outputs)
    forward["logits"] = _to_numpy(logits)
    grads = {n: (_to_numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32))
             for n, p in model.named_parameters() if p.requires_grad}
    index = {"framework": f"torch {torch.__version__}", "model": type(model).__name__, "loss": float(loss.item()),
             "compute_dtype": str(logits.dtype).replace("torch.", ""), "device": str(device), "names": "own"}
    if name_map:
        forward, fsrc = apply_name_map(forward, dict(name_map, logits="logits"))
        grads, gsrc = apply_name_map(grads, name_map)
        index.update(names="ms_llm", their_names={**fsrc, **gsrc})
    return write_dump(out_dir, forward, grads, ids.cpu().numpy(), index)

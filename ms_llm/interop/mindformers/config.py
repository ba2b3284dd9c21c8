"""MindFormers Llama YAML → ms_llm config, with a row per source key (see mindformers_table).

    ms-llm convert --from-mindformers-config pretrain_llama2_7b.yaml --output llama2_7b.yaml [--samples N]

Values that change meaning are converted and the conversion is stated in the row:
  batch      MindFormers' runner_config.batch_size is per device and per micro-step; ours is the global batch:
             global = batch_size × micro_batch_interleave_num × data_parallel × gradient_accumulation_steps
             (× micro_batch_num instead of the accumulation under pipeline parallelism, as MindFormers does).
  epochs     MindFormers trains `epochs` passes; ms_llm counts optimizer steps: epochs × samples // global.
  defaults   where a key is absent, MindFormers' default is written when ours differs (weight decay 0,
             no warmup, lr_end 0, untied head, ...), so the run means what it meant there.
"""
import os

from ms_llm.errors import UserError
from ms_llm.fileio import interpreting
from ms_llm.interop.mindformers import model_rules
from ms_llm.interop.mindformers import moe_rules
from ms_llm.interop.mindformers import run_rules
from ms_llm.interop.mindformers import train_rules
from ms_llm.interop.mindformers.table import Ledger, format_table, summary_counts


def import_config(raw, samples=None, devices=None, path="the config"):
    """(our config as a dict of sections, rows, facts) for a MindFormers YAML mapping `raw`."""
    if not isinstance(raw, dict) or not isinstance((raw.get("model") or {}).get("model_config"), dict):
        raise UserError(f"{path} has no model.model_config section: it is not a MindFormers model config. Give the "
                        f"YAML you pass to MindFormers' run_mindformer.py (e.g. configs/llama2/pretrain_llama2_7b.yaml).")
    t = Ledger(raw)
    facts = {}
    model_rules.model(t, facts)
    moe_rules.moe(t)
    train_rules.batch(t, facts, devices)
    train_rules.parallel(t, facts)
    train_rules.recompute(t)
    train_rules.schedule(t, facts, samples)
    train_rules.optimizer(t)
    train_rules.precision(t)
    run_rules.data(t)
    run_rules.callbacks(t)
    run_rules.context(t)
    run_rules.top_level(t)
    return t.ours, t.finish(), facts


def convert_config(src, out, samples=None, devices=None, log=print):
    from ms_llm.config import config_from_dict
    from ms_llm.config.loader import read_yaml
    from ms_llm.parallel.shapes import ModelShape

    if samples is not None and samples <= 0:
        raise UserError(f"--samples = {samples} must be the (positive) number of training samples in the dataset.")
    if os.path.exists(out):
        raise UserError(f"--output '{out}' already exists: choose another file name (a converted config is never "
                        f"overwritten).")
    raw = read_yaml(src)
    # a value of the wrong type deep in a rule (a list where a number goes) is one paragraph naming the file
    with interpreting(src, "MindFormers config", "Fix that value (docs/from_mindformers.md lists the keys read)."):
        if samples is None:
            samples = count_samples(raw)
        ours, rows, facts = import_config(raw, samples, devices, f"'{src}'")
        cfg = config_from_dict(ours)
        pc = cfg.parallel_config
        if pc.data_parallel:  # the layout must also pass the planner's checks (micro-batches, divisibility)
            from ms_llm.parallel.layout import build_plan

            build_plan(cfg, pc.data_parallel * pc.model_parallel * pc.pipeline_stage)
    log(format_table(rows))
    counts = summary_counts(rows)
    log("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f" ({len(rows)} rows)")
    n = ModelShape.from_config(cfg.model).total_params()
    m, tr = cfg.model, cfg.train
    log(f"model: llama, {n:,} parameters ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, "
        f"{m.num_kv_heads} kv heads, ffn {m.ffn_hidden_size}, seq {m.seq_length}, vocab {m.vocab_size})")
    log(f"batch: global {tr.global_batch_size} = micro {tr.micro_batch_size} × data-parallel {facts['dp']} × "
        f"{'pipeline micro-batches' if facts['pp'] > 1 else 'accumulation'} "
        f"{tr.global_batch_size // (tr.micro_batch_size * facts['dp'])}")
    write_yaml(ours, out, src, counts)
    log(f"wrote {out}. Next: ms-llm plan --config {out}; ms-llm train --config {out} --dry-run")
    return cfg, rows


def count_samples(raw):
    """Training samples in train_dataset's MindRecord when it is readable here (epochs → steps), else None."""
    d = ((raw.get("train_dataset") or {}).get("data_loader") or {}).get("dataset_dir")
    if not d or not os.path.exists(d):
        return None
    from ms_llm.interop.mindrecord_count import count

    return count(d)


def write_yaml(ours, out, src, counts):
    import yaml

    header = (f"# Converted from the MindFormers config {os.path.basename(src)} by `ms-llm convert "
              f"--from-mindformers-config`.\n# Keys: " + ", ".join(f"{n} {s}" for s, n in counts.items())
              + ". The command printed what became of each.\n")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    class Dumper(yaml.SafeDumper):  # sections as blocks, short lists ([4, 0]) inline
        pass

    Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
    with open(out, "w", encoding="utf-8") as f:
        f.write(header)
        yaml.dump(ours, f, Dumper=Dumper, sort_keys=False, default_flow_style=False)

"""Where a logged interval goes: the console line, metrics.jsonl and MindSpore Insight summaries."""
import json
import math
import os

SUMMARY_SCALARS = ("loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "val_loss")


def format_line(r, max_steps):
    """`step 200/2000 | loss 2.4312 | lr 9.80e-04 | ... | data 2%` from a metrics record."""
    if "val_loss" in r:
        return f"step {r['step']}/{max_steps} | val_loss {r['val_loss']:.4f} | {r['val_tokens']:,} tokens"
    if "event" in r:
        return f"step {r['step']}/{max_steps} | " + " | ".join(f"{k} {v}" for k, v in r.items() if k != "step")
    parts = [f"step {r['step']}/{max_steps}", f"loss {r['loss']:.4f}", f"lr {r['lr']:.2e}",
             f"grad_norm {r['grad_norm']:.3f}", f"scale {r['loss_scale']:g}", f"skipped {r['skipped']}",
             f"{r['tokens_per_s']:,.0f} tok/s", f"mfu {100 * r['mfu']:.1f}%", f"mem {r['mem_gib']:.2f} GiB",
             f"data {100 * r['data_wait_frac']:.0f}%"]
    return " | ".join(parts)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/Inf; keep them readable instead of invalid
    return v


class MetricsWriter:
    """Writes records on rank 0 only; other ranks print their lines to their own (msrun) log."""

    def __init__(self, run_dir, rank, max_steps, summary=True, echo=print):
        self.rank, self.max_steps, self.echo = rank, max_steps, echo
        self.jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8") if rank == 0 else None
        self.summary = None
        if summary and rank == 0:
            from ms_llm.monitor.summary import InsightSummary

            self.summary = InsightSummary(os.path.join(run_dir, "summary"))

    def write(self, record):
        self.echo(format_line(record, self.max_steps) if "step" in record else json.dumps(record))
        if self.jsonl is None:
            return
        self.jsonl.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self.jsonl.flush()
        if self.summary is not None and "step" in record:
            scalars = {k: record[k] for k in SUMMARY_SCALARS
                       if isinstance(record.get(k), (int, float)) and math.isfinite(record[k])}
            self.summary.scalars(record["step"], scalars)

    def close(self):
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.summary is not None:
            self.summary.close()
            self.summary = None

"""Watching a training run from the inside: the NaN trigger and tensor statistics.

Both cost nothing when off. `monitor.nan_check` checks every step's loss and gradient norm (one host
sync per step); the first non-finite step is saved (`<run>/nan/step_<n>/`: batch, pre-step weights,
report) and replayed by the NaN hunter. (Token ids are checked before every step whether or not this is
on: ms_llm.train.session.)
`monitor.tensor_stats` probes one step in every `every` (a compiled probe on the same pre-step weights
and batch) and appends per-layer records to `<run>/stats.jsonl`.
"""
import json
import math
import os

import numpy as np

from ms_llm.debug import nan_hunter
from ms_llm.train.loop.hooks import Hook
from ms_llm.rundir import names


class NanWatch(Hook):
    """A trainer hook (`monitor.nan_check`)."""

    def __init__(self):
        self.reported = False

    def start(self, run):
        s = run.session
        self.dir = os.path.join(run.run_dir, "nan")
        self.rank, self.dtype, self.log = s.rt.rank, s.cfg.precision.compute_dtype, run.log

    def after_step(self, run, step, out, batches):
        session, writer = run.session, run.writer
        loss, grad_norm, code = float(out[0].asnumpy()), float(out[1].asnumpy()), int(out[2].asnumpy())
        if self.reported or (math.isfinite(loss) and math.isfinite(grad_norm) and code != 1):
            return
        self.reported = True  # the first occurrence is the informative one
        from ms_llm.checkpoint import state as ckpt_state

        ids = np.concatenate([b.asnumpy() for b in batches])
        report = nan_hunter.hunt(session.model, ids, self.dtype)
        where = self.save(step, np.stack([b.asnumpy() for b in batches]), ckpt_state.capture(session), report)
        self.log(f"step {step + 1}: non-finite loss/gradients (loss {loss}, grad_norm {grad_norm}); the update was "
                 f"skipped. Saved to {where}\n" + nan_hunter.format_report(report))
        writer.write({"step": step + 1, "event": "nonfinite", "culprit": report.get("culprit"),
                      "cause": report.get("cause"), "saved": where})

    def save(self, step, batch, arrays, report):
        from ms_llm.checkpoint import store

        where = os.path.join(self.dir, f"step_{step + 1}", f"rank_{self.rank}")
        os.makedirs(where, exist_ok=True)
        np.save(os.path.join(where, "batch.npy"), batch)
        if arrays is not None:
            store.write_tensors(os.path.join(where, "state.ckpt"), arrays, "ckpt")
        with open(os.path.join(where, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
        return where


def _wanted(name, targets):
    return not targets or any(t in name for t in targets)


class TensorStats(Hook):
    """A trainer hook (`monitor.tensor_stats`). Every `every` steps: residual-stream and gradient statistics of
    the step's batch on the pre-step weights (one compiled probe, ms_llm.debug.stats_probe), AdamW moment norms,
    update ratios ||Δw||/||w|| (host copies: models up to 200M parameters), and flags."""

    UPDATE_RATIO_LIMIT = 200_000_000

    def __init__(self, cfg_stats, run_dir=None, rank=0, world_size=1, log=print):
        self.cfg, self.log, self.world_size = cfg_stats, log, world_size
        self.path = os.path.join(run_dir, names.STATS) if run_dir and rank == 0 else None
        self.low = {}  # parameter -> consecutive records with a vanishing gradient
        self.history = []  # total gradient norms of earlier records
        self.probe = self.before = self.pending = None

    def start(self, run):
        rt = run.session.rt
        self.path = os.path.join(run.run_dir, names.STATS) if rt.rank == 0 else None
        self.world_size, self.log = rt.world_size, run.log

    def due(self, step):
        """`step` is the number of steps done before this one."""
        return self.path is not None and (step + 1) % self.cfg.every == 0

    def before_step(self, run, step, batches):
        if self.due(step):
            self.probe_step(run.session, batches)

    def after_step(self, run, step, out, batches):
        if self.pending is not None:
            self.record(run.session, step, out)

    def probe_step(self, session, batches):
        from mindspore import ops

        from ms_llm.debug.stats_probe import StatsProbe

        if self.probe is None:
            self.probe = StatsProbe(session.model, session.step_fn.optimizer, session.accum)
        params = session.model.trainable_params()
        if session.n_params <= self.UPDATE_RATIO_LIMIT:
            self.before = {p.name: p.asnumpy().copy() for p in params}
        acts, grads, moments, _ = self.probe(ops.stack(batches))
        self.pending = (acts.asnumpy(), grads.asnumpy(), moments.asnumpy())

    def record(self, session, step, out):
        from ms_llm.debug.stats_probe import STAT_NAMES

        acts, grads, moments = self.pending
        params = session.model.trainable_params()
        states = ["embedding"] + [f"layers.{i}" for i in range(len(session.model.layers))] + ["final_norm"]
        lines = [{"step": step + 1, "kind": "activation", "name": n, **dict(zip(STAT_NAMES, map(float, row)))}
                 for n, row in zip(states, acts) if _wanted(n, self.cfg.targets)]
        total = math.sqrt(float((grads[:, 3].astype(np.float64) ** 2).sum()))
        opt = session.step_fn.optimizer
        for i, p in enumerate(params):
            if not _wanted(p.name, self.cfg.targets):
                continue
            g = dict(zip(STAT_NAMES, map(float, grads[i])))
            lines.append({"step": step + 1, "kind": "gradient", "name": p.name, **g})
            if self.before is not None:
                w0 = self.before[p.name]
                ratio = float(np.linalg.norm(p.asnumpy() - w0) / (np.linalg.norm(w0) + 1e-30))
                lines.append({"step": step + 1, "kind": "update_ratio", "name": p.name, "value": ratio})
            lines.append({"step": step + 1, "kind": "optimizer", "name": p.name,
                          "exp_avg_norm": float(moments[i, 0]), "exp_avg_sq_norm": float(moments[i, 1])})
            lines += self.flags(step, p, opt.exp_avg[i], g)
        lines += self.global_flags(step, total, float(out[1].asnumpy()), session.accum)
        with open(self.path, "a", encoding="utf-8") as f:
            for rec in lines:
                f.write(json.dumps(rec) + "\n")
        for rec in lines:
            if rec["kind"] == "flag":
                self.log(f"stats: {rec['flag']} at step {rec['step']}: {rec['name']} — {rec['detail']}")
        self.before = self.pending = None

    def flags(self, step, p, m, g):
        out = []
        if p.dtype != m.dtype:
            out.append({"step": step + 1, "kind": "flag", "flag": "dtype_mismatch", "name": p.name,
                        "detail": f"master weight {p.dtype} but optimizer state {m.dtype}"})
        self.low[p.name] = self.low.get(p.name, 0) + 1 if g["norm"] < self.cfg.vanish_norm else 0
        if self.low[p.name] == self.cfg.vanish_records:
            out.append({"step": step + 1, "kind": "flag", "flag": "vanishing", "name": p.name,
                        "detail": f"gradient norm < {self.cfg.vanish_norm:g} for {self.cfg.vanish_records} records"})
        return out

    def global_flags(self, step, total, reported, accum):
        out = []
        h = self.history
        if len(h) >= 5:
            mean, std = float(np.mean(h)), float(np.std(h)) + 1e-12
            if (total - mean) / std > self.cfg.explode_zscore:
                out.append({"step": step + 1, "kind": "flag", "flag": "exploding", "name": "gradient norm",
                            "detail": f"{total:.3g} vs mean {mean:.3g} ± {std:.3g} of the last {len(h)} records"})
        h.append(total)
        del h[:-50]
        # the step's own (pre-clip) norm must equal the norm of the mean loss's gradient measured here
        if self.world_size == 1 and total > 0 and math.isfinite(reported):
            ratio = reported / total
            if abs(ratio - 1) > 0.05:
                why = (f"≈ accumulation steps ({accum}): the loss is not divided by the accumulation steps"
                       if accum > 1 and abs(ratio - accum) / accum < 0.1 else "the step's loss is not the mean loss")
                out.append({"step": step + 1, "kind": "flag", "flag": "grad_scale_mismatch", "name": "gradient norm",
                            "detail": f"the step reports {reported:.4g}, the mean loss's gradient has norm "
                                      f"{total:.4g} (x{ratio:.2f}) {why}"})
        return out

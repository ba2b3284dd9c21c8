"""Preference optimisation on chosen/rejected pairs (a dataset of `ms-llm preprocess --format preference`):
DPO, IPO against a frozen reference, and SimPO without one, equal to TRL's.

A sample holds one pair (ms_llm/data/preference.py): segment 1 is prompt + chosen response, segment 2 prompt +
rejected response, the loss mask on the responses. The model reads the two segments as two documents (their own
attention and positions), so each sequence's log-probability is what it has alone:

    logp(y | x) = Σ over the response's target tokens of log softmax(logits)[token]      (float32)

With π the policy being trained, ref the frozen reference (log-probs computed once before training: `prepare`),
β = finetune.preference.beta, per pair, the mean over the micro-batch's pairs being the loss:

    dpo     (TRL DPOTrainer, loss_type="sigmoid", label_smoothing 0)
            z = (logπ(c) − logπ(r)) − (logref(c) − logref(r));            loss = −log σ(β z)
    ipo     (TRL DPOTrainer, loss_type="ipo": log-ratios averaged over each response's tokens)
            z = (logπ(c) − logref(c)) / |c| − (logπ(r) − logref(r)) / |r|; loss = (z − 1/(2β))²
    simpo   (TRL CPOTrainer, loss_type="simpo", cpo_alpha 0: no reference; log-probs averaged over tokens)
            z = logπ(c)/|c| − logπ(r)/|r| − γ/β;                            loss = −log σ(β z)

The metrics, under TRL's names, are those TRL logs: rewards/chosen = β (logπ(c) − logref(c)) (SimPO: β logπ(c)/|c|),
rewards/rejected likewise, rewards/accuracies = share of pairs with chosen reward > rejected reward,
rewards/margins = mean (chosen − rejected reward), logps/chosen and logps/rejected = mean logπ (SimPO: per token).
The step sums them over its micro-batches into the aux buffer `preference_stats` (StepState.aux_sums, as the routed
loss's router statistics), read once per log interval (`log_fields`); validation logs them as val_rewards/... .

Equal micro-batches hold equal numbers of pairs, so the mean per micro-batch, averaged by the step over the
accumulation and the data-parallel ranks, is the mean over the global batch (what TRL's loss is).

The reference (`prepare`, before the first step): the policy's starting point. DPO/IPO need logref of every
pair; they are computed once, with the model in evaluation mode, from the reference's weights (a fresh run: the
weights the run starts from; LoRA: the base with the adapters off, B = 0; a resumed run: those again, from
checkpoint.load_weights, the LoRA base, or the seed's initialisation) and stored beside the dataset, in
`<dataset>/reference_logps/<key>.npz`, the key a SHA-256 of the reference's weights, the dataset's files, the
sequence length and the compute dtype: another model, another dataset or another precision never reuses them.
Each pair is found there by a digest of its sample, so the order the loader draws them in does not matter.
"""
import hashlib
import json
import os

import numpy as np

import mindspore as ms
from mindspore import ops

from ms_llm.data.preference import CHOSEN, REJECTED
from ms_llm.errors import UserError
from ms_llm.train.losses.masked import target_weights, token_cross_entropy
from ms_llm.train.losses.part import Objective

STATS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
         "logps/rejected")
REFERENCE_DIR = "reference_logps"
NEEDS_REFERENCE = ("dpo", "ipo")


def softplus(x):
    """log(1 + exp(x)), stable for any x: −log σ(z) = softplus(−z)."""
    return ops.maximum(x, 0.0) + ops.log1p(ops.exp(-ops.abs(x)))


def row_key(ids, segments):
    """16 bytes naming one sample (its ids and segments): where its reference log-probs are found."""
    return hashlib.blake2b(np.ascontiguousarray(ids, np.int32).tobytes()
                           + np.ascontiguousarray(segments, np.int32).tobytes(), digest_size=16).digest()


def settings(cfg):
    """finetune.preference, its defaults when the section is not set (DPO, beta 0.1)."""
    from ms_llm.config.schema import PreferenceConfig

    return cfg.finetune.preference or PreferenceConfig()


class PairObjective(Objective):
    """The pair loss of `objective` ("dpo", "ipo", "simpo") on the logits of the pairs' two segments: (ids (B, T+1),
    segments (B, T+1), chosen weights (B, T), rejected weights (B, T), reference log-probs (B, 2)) → (loss, loss,
    stats (7,)), to which a mixture of experts' router term is added like to any other (composed.py). See the module
    docstring."""

    has_columns = True

    @classmethod
    def of(cls, cfg):
        p = settings(cfg)  # a preference dataset without finetune.preference: its defaults (DPO, beta 0.1)
        return cls(p.loss, p.beta, p.simpo_gamma)

    def __init__(self, objective="dpo", beta=0.1, simpo_gamma=0.5):
        super().__init__()
        self.objective, self.beta, self.gamma = objective, float(beta), float(simpo_gamma)
        self.aux_shapes = (("preference_stats", (len(STATS) + 1,)),)
        self.reference = None  # {sample digest: (logref chosen, logref rejected)} once `prepare` ran
        self.buffer = None  # the step's preference_stats buffer

    # --- host side -------------------------------------------------------------------------------------------

    def columns(self, batch):
        """(ids, segments, chosen weights, rejected weights) of a micro-batch, numpy."""
        ids, mask, seg = batch.ids.asnumpy(), batch.loss_mask.asnumpy(), batch.segments.asnumpy()
        w = target_weights(mask, seg)
        st = seg[:, 1:]
        return ids, seg, w * (st == CHOSEN), w * (st == REJECTED)

    def reference_of(self, ids, seg):
        if self.objective not in NEEDS_REFERENCE:
            return np.zeros((len(ids), 2), np.float32)
        if self.reference is None:
            raise UserError("the preference loss has no reference log-probs: the run did not prepare them "
                            "(PairObjective.prepare runs before the first step of `ms-llm train`). Train with "
                            "`ms-llm train`, or use finetune.preference.loss: simpo, which needs no reference.")
        out = np.empty((len(ids), 2), np.float32)
        for i in range(len(ids)):
            got = self.reference.get(row_key(ids[i], seg[i]))
            if got is None:
                raise UserError("a preference pair of this batch has no reference log-prob in the reference table "
                                "(the dataset changed after the table was made?). Delete the dataset's "
                                f"{REFERENCE_DIR}/ folder to compute them again.")
            out[i] = got
        return out

    def inputs(self, batches, count, training):
        out = []
        for b in batches:
            ids, seg, wc, wr = self.columns(b)
            out.append((b.ids, b.segments, ms.Tensor(wc.astype(np.float32)), ms.Tensor(wr.astype(np.float32)),
                        ms.Tensor(self.reference_of(ids, seg))))
        return out

    def log_fields(self):
        """The interval's metrics (TRL's names), from the step's preference_stats buffer, which is then zeroed."""
        if self.buffer is None:
            return {}
        sums = self.buffer.asnumpy().astype(np.float64)
        self.buffer.set_data(ms.Tensor(np.zeros(sums.shape, np.float32)))
        return fields(sums)

    def eval_sums(self, outputs):
        """The summed stats (STATS, then the pairs) over this rank's batches, then its mean loss."""
        sums = np.zeros(len(STATS) + 1, np.float64)
        for out in outputs:
            sums += out[2].asnumpy()
        return np.append(sums, np.mean([float(out[1].asnumpy()) for out in outputs]))

    def eval_record(self, sums, ranks):
        """val_loss: the mean loss over the validation pairs (of the ranks' means: each holds as many pairs);
        val_rewards/... and val_logps/... as in training."""
        stats = sums[:-1]
        record = {"val_loss": float(sums[-1] / ranks)}
        record.update({f"val_{k}": v for k, v in fields(stats).items()})
        record["val_pairs"] = int(stats[-1])
        return record

    # --- the reference -----------------------------------------------------------------------------------------

    def prepare(self, loss, session, log, resumed):
        """Before the first step: find the step's stats buffer; for DPO/IPO, the reference log-probs of every pair
        of the training and validation splits, from the stored table or computed now (module docstring)."""
        self.buffer = next((p for p in session.step_fn.state.aux_sums if p.name == "preference_stats"), None)
        p = settings(session.cfg)
        what = {"dpo": "DPO (TRL sigmoid)", "ipo": "IPO", "simpo": "SimPO (no reference)"}[self.objective]
        log(f"preference optimisation: {what}, beta {p.beta:g}"
            + (f", gamma {p.simpo_gamma:g}" if self.objective == "simpo" else ""))
        if self.objective not in NEEDS_REFERENCE:
            return
        ref_arrays, swap = reference_weights(session, resumed)
        key = reference_key(session, ref_arrays)
        path = reference_path(session.cfg.data.dataset_dir, key)
        table = load_table(path, key)
        if table is not None:
            self.reference = table
            log(f"reference log-probs: {len(table):,} pairs from {path}")
            return
        with swapped(session, ref_arrays if swap else None):
            table = self.compute_reference(loss, session)
        self.reference = table
        where = save_table(path, key, table)
        log(f"reference log-probs: {len(table):,} pairs computed from the reference"
            + (f", stored in {where}" if where else " (the dataset folder is not writable: not stored)"))

    def compute_reference(self, loss, session):
        """{sample digest: (logp chosen, logp rejected)} of every pair, `loss` (the composed loss) in evaluation."""
        from ms_llm.data.loader import TrainBatches

        cfg = session.cfg
        mb = cfg.train.micro_batch_size
        table = {}
        one = ms.Tensor(1.0, ms.float32)
        loss.set_train(False)
        try:
            for split in ("train", "val"):
                if not session.manifest["splits"].get(split, {}).get("samples"):
                    continue
                it = TrainBatches(cfg.data.dataset_dir, session.manifest, split, mb, 1, 0, cfg.train.seed,
                                  cfg.model.seq_length, shuffle=False, num_workers=cfg.data.num_workers)
                for _ in range(-(-it.num_samples // mb)):
                    b = next(it)
                    ids, seg, wc, wr = self.columns(b)
                    out = loss(one, b.ids, b.segments, ms.Tensor(wc.astype(np.float32)),
                               ms.Tensor(wr.astype(np.float32)), ms.Tensor(np.zeros((len(ids), 2), np.float32)))
                    logps = out[3].asnumpy()
                    for i in range(len(ids)):
                        table[row_key(ids[i], seg[i])] = logps[i].astype(np.float32)
        finally:
            loss.set_train(True)
        return table

    # --- the graph -----------------------------------------------------------------------------------------------

    def segments(self, columns):
        return columns[0][:, :-1]  # the pair's two sequences as two documents

    def train(self, logits, targets, grad_scale, share, columns):
        loss, stats = self.pair_loss(logits, targets, columns)[:2]
        return loss, loss, (stats,)

    def evaluate(self, logits, targets, columns):
        loss, stats, logps, counts = self.pair_loss(logits, targets, columns)
        return ops.zeros((), ms.float32), loss, stats, logps, counts

    def pair_loss(self, logits, targets, columns):
        """(mean loss over the pairs, summed stats (7,), (logp chosen, logp rejected) (B, 2), their tokens (B, 2))."""
        chosen_w, rejected_w, reference = columns[1], columns[2], columns[3]
        b, t = chosen_w.shape
        lp = -token_cross_entropy(logits, targets).reshape(b, t)
        sc, sr = (lp * chosen_w).sum(-1), (lp * rejected_w).sum(-1)
        nc, nr = ops.maximum(chosen_w.sum(-1), 1.0), ops.maximum(rejected_w.sum(-1), 1.0)
        ref_c, ref_r = reference[:, 0], reference[:, 1]
        beta = self.beta
        if self.objective == "simpo":
            avg_c, avg_r = sc / nc, sr / nr
            losses = softplus(-beta * (avg_c - avg_r - self.gamma / beta))
            reward_c, reward_r, logp_c, logp_r = beta * avg_c, beta * avg_r, avg_c, avg_r
        else:
            if self.objective == "ipo":
                z = (sc - ref_c) / nc - (sr - ref_r) / nr
                losses = (z - 1.0 / (2.0 * beta)) ** 2
            else:
                losses = softplus(-beta * ((sc - sr) - (ref_c - ref_r)))
            reward_c, reward_r, logp_c, logp_r = beta * (sc - ref_c), beta * (sr - ref_r), sc, sr
        loss = losses.mean()
        reward_c, reward_r = ops.stop_gradient(reward_c), ops.stop_gradient(reward_r)
        logp_c, logp_r = ops.stop_gradient(logp_c), ops.stop_gradient(logp_r)
        stats = ops.stack([reward_c.sum(), reward_r.sum(), (reward_c > reward_r).astype(ms.float32).sum(),
                           (reward_c - reward_r).sum(), logp_c.sum(), logp_r.sum(),
                           ops.ones((), ms.float32) * b])
        return loss, stats, ops.stack([sc, sr], -1), ops.stack([nc, nr], -1)


def fields(sums):
    """{TRL metric name: mean over the pairs} of summed statistics (STATS, then the number of pairs)."""
    n = float(sums[-1])
    if n <= 0:
        return {}
    return {k: float(v / n) for k, v in zip(STATS, sums[:-1])}


# --- the reference's weights and its table -------------------------------------------------------------------

def reference_weights(session, resumed):
    """({parameter name: numpy array} of the reference model, whether they must be swapped into the model to
    compute with them). LoRA: the frozen base (the adapters are switched off by zeroing B while computing)."""
    from model_zoo import weights

    ft = session.finetune
    model_params = weights(session.model)  # every weight (not dropout's key)
    if ft is not None and ft.lora is not None:
        from ms_llm.nn.lora import is_adapter

        arrays = {n: p.asnumpy() for n, p in model_params.items() if not is_adapter(n)}
        return arrays, True  # adapters off: B = 0 (a resumed run's B is not zero)
    if not resumed:
        return {n: p.asnumpy() for n, p in model_params.items()}, False
    path = session.cfg.checkpoint.load_weights
    if path:
        from ms_llm.checkpoint import store

        src = store.read_tensors(path)
        missing = [n for n in model_params if n not in src]
        if missing:
            raise UserError(f"resuming a preference run: checkpoint.load_weights = '{path}' (its reference) lacks "
                            f"{', '.join(missing[:4])}: the reference log-probs cannot be found or computed. Resume "
                            f"with the checkpoint.load_weights the run started from.")
        arrays = {n: np.asarray(src[n]).astype(p.asnumpy().dtype) for n, p in model_params.items()}
    else:  # trained from the seed's initialisation: that is its reference
        init = session.initial_state()
        arrays = {n: init[n].asnumpy() for n in model_params if n in init}
    return arrays, True


def weights_digest(arrays):
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def reference_key(session, arrays):
    cfg = session.cfg
    data = {s: [(x.get("file"), x.get("sha256"), x.get("samples")) for x in v.get("shards", [])]
            for s, v in session.manifest["splits"].items()}
    what = {"weights": weights_digest(arrays), "data": data, "seq_length": cfg.model.seq_length,
            "compute_dtype": cfg.precision.compute_dtype, "arch": cfg.model.arch}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def reference_path(dataset_dir, key):
    return os.path.join(dataset_dir, REFERENCE_DIR, f"{key[:32]}.npz")


def load_table(path, key):
    """The stored table of `key`, or None (missing, unreadable, or made for another key: never reused)."""
    try:
        with np.load(path) as z:
            if str(z["key"]) != key:
                return None
            return {bytes(k): v for k, v in zip(z["rows"], z["logps"])}
    except (OSError, KeyError, ValueError):
        return None


def save_table(path, key, table):
    from ms_llm.fileio import atomic_write_bytes
    import io

    rows = np.array(list(table.keys()), dtype="S16")
    logps = np.stack(list(table.values())).astype(np.float32) if table else np.zeros((0, 2), np.float32)
    buf = io.BytesIO()
    np.savez(buf, key=np.array(key), rows=rows, logps=logps)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_bytes(path, buf.getvalue())
        return path
    except OSError:
        return None


class swapped:
    """Within the block, the model computes as the reference: its weights set to `arrays` (None: as they are) and
    LoRA's B matrices at zero; restored after."""

    def __init__(self, session, arrays):
        self.session, self.arrays, self.saved = session, arrays, {}

    def __enter__(self):
        if self.arrays is None:
            return self
        from ms_llm.nn.lora import ADAPTER_SUFFIXES

        from model_zoo import weights

        for p in weights(self.session.model).values():
            target = self.arrays.get(p.name)
            if p.name.endswith(ADAPTER_SUFFIXES[1]):
                target = np.zeros(p.shape, np.float32)
            if target is None:
                continue
            self.saved[p.name] = p.asnumpy().copy()
            p.set_data(ms.Tensor(np.asarray(target)).astype(p.dtype))
        return self

    def __exit__(self, *exc):
        from model_zoo import weights

        for p in weights(self.session.model).values():
            if p.name in self.saved:
                p.set_data(ms.Tensor(self.saved[p.name]).astype(p.dtype))
        return False

"""What a loss is judged against, besides its own first value (`ms-llm diagnose`'s progress rules):

- the uniform loss ln(vocab_size): a model that has learned nothing;
- the unigram entropy of the training data: the loss of a model that ignores the context and predicts token
  frequencies. It comes from the dataset's manifest (`stats.<split>.unigram_entropy_nats`, written by
  preprocessing) or, for older datasets, is counted from the training split once and cached;
- sibling runs: runs of the same training config in the same folder (seeds, restarts), whose losses at the same
  steps say what this config usually reaches;
- the trend of the curve over a window (least-squares slope and the noise around it), which tells a plateau from
  a slow, steady fall anywhere in the run.
"""
import hashlib
import json
import math
import os
import statistics
from dataclasses import dataclass

from ms_llm.diagnose.common import cache_dir, finite, points

UNIGRAM_MAX_TOKENS = 20_000_000  # counted from the dataset when the manifest has no entropy (a few seconds)
SIBLINGS_MAX = 200               # run folders looked at next to the run
# Config keys that do not change what a run computes: runs differing only in these are siblings.
NOT_TRAINING = ("monitor.", "context.", "checkpoint.save_interval", "checkpoint.keep_last", "checkpoint.format",
                "checkpoint.async_save", "checkpoint.remote_dir", "checkpoint.uploader", "checkpoint.strategy_dir",
                "checkpoint.remote_endpoint", "checkpoint.upload_budget_s",
                "checkpoint.auto_resume", "train.seed", "train.log_interval", "train.eval_interval",
                "train.eval_steps", "train.stop_at_step", "data.num_workers", "data.source")


def uniform_loss(run):
    """ln(vocab): the loss of a uniform guess, when the run's loss is cross-entropy (Run.token_loss), else None."""
    vocab = run.cfg("model.vocab_size") if run.token_loss else None
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None


# --- the dataset --------------------------------------------------------------------------------------

def dataset_dir(run):
    """The run's dataset folder (holding manifest.json) as seen from here, or None (blends, moved data).
    A relative data.dataset_dir is tried from the current directory, then from the folder above runs/<name>."""
    d = run.cfg("data.dataset_dir")
    if not isinstance(d, str) or run.cfg("data.blend"):
        return None
    tries = [d] if os.path.isabs(d) else [d, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(run.path))), d)]
    return next((t for t in tries if os.path.isfile(os.path.join(t, "manifest.json"))), None)


def manifest(run):
    d = dataset_dir(run)
    if d is None:
        return None
    try:
        with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("splits"), dict) else None


def train_samples(run):
    m = manifest(run)
    n = ((m or {}).get("splits") or {}).get("train", {}).get("samples")
    return n if isinstance(n, int) and n > 0 else None


def epochs_at(run, step):
    """Passes over the training data by `step` (global batch x steps / training samples), or None."""
    n, gbs = train_samples(run), run.cfg("train.global_batch_size")
    return step * gbs / n if n and gbs else None


@dataclass
class Entropy:
    nats: float
    source: str  # where it came from, for the evidence line


def unigram_entropy(run):
    """The unigram entropy (nats/token) of the run's training data, or None when it cannot be known. Every value
    found is also remembered under the dataset's path, so a run diagnosed after its dataset moved still has it.
    None too when the run's loss is not cross-entropy (Run.token_loss): then it is no level of that loss."""
    if not run.token_loss:
        return None
    m = manifest(run)
    if m is None:  # the dataset is not here: the statistics the trainer copied into run_info.json, if any
        found = from_stats((run.info.get("dataset") or {}).get("stats"), "run_info.json (the dataset's {} statistics)")
        return found or remembered(run)
    d = dataset_dir(run)
    found = from_stats(m.get("stats"), "manifest.json ({})")
    if found:
        remember(d, found.nats, found.source)
        return found
    key = hashlib.sha1(repr((os.path.abspath(d), os.path.getmtime(os.path.join(d, "manifest.json")),
                             os.path.getsize(os.path.join(d, "manifest.json")))).encode()).hexdigest()[:16]
    path = cache_dir(f"unigram_{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            c = json.load(f)
        return Entropy(c["nats"], f"counted from {c['tokens']:,} training tokens")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        nats, tokens = count_unigram_entropy(d, m)
    except Exception:  # noqa: BLE001 (an unreadable dataset only costs this reference)
        return None
    if nats is None:
        return None
    source = f"counted from {tokens:,} training tokens"
    write_json(path, {"nats": nats, "tokens": tokens, "dataset": os.path.abspath(d)})
    remember(d, nats, source)
    return Entropy(nats, source)


def split_entropy(run, split):
    """The unigram entropy of one split ("train", "val") as an Entropy, from the manifest (or the copy of its
    statistics in run_info.json), or None (also when the run's loss is not cross-entropy: Run.token_loss). Only what
    preprocessing measured: no counting here."""
    if not run.token_loss:
        return None
    m = manifest(run)
    stats = (m or {}).get("stats") if m else (run.info.get("dataset") or {}).get("stats")
    h = ((stats or {}).get(split) or {}).get("unigram_entropy_nats")
    where = "manifest.json" if m else "run_info.json (the dataset's statistics)"
    return Entropy(h, f"{where} ({split})") if finite(h) and h > 0 else None


def split_overlap(run):
    """(the manifest's `overlap` entry (ms_llm.data.overlap), where it came from) or (None, why not)."""
    m = manifest(run)
    if m is not None:
        entry = m.get("overlap")
        return (entry, "manifest.json") if entry else (None, "the dataset's manifest predates the measure (ms-llm "
                                                              "data info DIR measures it)")
    entry = (run.info.get("dataset") or {}).get("overlap")
    return (entry, "run_info.json (the dataset's manifest)") if entry else (None, "the dataset is not reachable "
                                                                                 "from here")


def split_method(run):
    m = manifest(run) or {}
    return m.get("split_method"), m.get("val_fraction", run.cfg("data.val_fraction"))


def from_stats(stats, source):
    """The entropy a dataset's statistics hold (the train split's, else the whole corpus's), or None."""
    for split in ("train", "all"):
        h = ((stats or {}).get(split) or {}).get("unigram_entropy_nats")
        if finite(h) and h > 0:
            return Entropy(h, source.format(split))
    return None


def _path_key(d):
    return cache_dir(f"unigram_path_{hashlib.sha1(os.path.abspath(d).encode()).hexdigest()[:16]}.json")


def remember(d, nats, source):
    write_json(_path_key(d), {"nats": nats, "source": source, "dataset": os.path.abspath(d)})


def remembered(run):
    """The entropy last seen for the run's dataset path, when the dataset itself is not reachable."""
    d = run.cfg("data.dataset_dir")
    if not isinstance(d, str) or run.cfg("data.blend"):
        return None
    tries = [d] if os.path.isabs(d) else [d, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(run.path))), d)]
    for t in tries:
        try:
            with open(_path_key(t), encoding="utf-8") as f:
                c = json.load(f)
            return Entropy(c["nats"], f"{c['source']}, remembered from an earlier look at {c['dataset']}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def write_json(path, obj):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(obj, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def count_unigram_entropy(d, m):
    """(entropy in nats, tokens counted) over the training split (at most UNIGRAM_MAX_TOKENS tokens); samples
    overlap by one token, so each row's first token is left out."""
    import numpy as np
    import mindspore.dataset as ds

    from ms_llm.data.manifest import split_shards

    vocab = int(m["vocab_size"])
    counts, total = np.zeros(vocab, np.int64), 0
    for shard in split_shards(m, "train"):
        start, end, row = shard["start"], shard["start"] + shard["samples"], 0
        data = ds.MindDataset([os.path.join(d, shard["file"])], columns_list=["input_ids"], shuffle=False)
        for (batch,) in data.batch(1024).create_tuple_iterator(num_epochs=1, output_numpy=True):
            lo, hi = max(start - row, 0), min(end - row, len(batch))
            if hi > lo:
                toks = batch[lo:hi, 1:].reshape(-1)
                toks = toks[(toks >= 0) & (toks < vocab)]
                counts += np.bincount(toks, minlength=vocab)[:vocab]
                total += len(toks)
            row += len(batch)
            if row >= end or total >= UNIGRAM_MAX_TOKENS:
                break
        if total >= UNIGRAM_MAX_TOKENS:
            break
    if total == 0:
        return None, 0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum()), int(total)


# --- sibling runs -------------------------------------------------------------------------------------

def training_key(config):
    from ms_llm.rundir.reader import flatten

    return {k: v for k, v in flatten(config).items() if not k.startswith(NOT_TRAINING)}


def siblings(run):
    """Other runs in the run's folder whose config differs from this one's only in keys that do not change the
    computation (seed, logging, checkpoints, monitors), with at least one training record."""
    from ms_llm.rundir.reader import is_run_dir, load_run, read_config
    from ms_llm.rundir.names import run_config_path

    if not run.config:
        return []
    here = os.path.abspath(run.path)
    parent = os.path.dirname(here)
    try:
        names = sorted(os.listdir(parent))[:SIBLINGS_MAX]
    except OSError:
        return []
    mine, out = training_key(run.config), []
    for name in names:
        p = os.path.join(parent, name)
        if p == here or not os.path.isdir(p) or not is_run_dir(p):
            continue
        config, _ = read_config(run_config_path(p))
        if not config or training_key(config) != mine:
            continue
        try:
            sib = load_run(p)
        except Exception:  # noqa: BLE001 (a sibling without metrics is no reference)
            continue
        if sib.train:
            out.append(sib)
    return out


# --- the shape of a curve -----------------------------------------------------------------------------

@dataclass
class Trend:
    first_step: int
    last_step: int
    slope: float   # loss per step (least squares)
    drop: float    # fall of the fitted line over the window (> 0: falling)
    noise: float   # RMS of the points around the line
    level: float   # median of the window
    records: int

    @property
    def falling_steadily(self):
        """A fall that stands well out of the noise around it, however small (at least 0.2% of the level)."""
        return self.drop > max(3 * self.noise, 0.002 * self.level)

    @property
    def flat(self):
        """No fall that stands out of the noise (or under 0.2% of the level)."""
        return self.drop < max(2 * self.noise, 0.002 * self.level)

    @property
    def smooth(self):
        """Little noise around the line: under 0.5% of the level (healthy small runs here: 0.5-1%)."""
        return self.noise < 0.005 * self.level


def trend(pts):
    """Least-squares line through (step, loss) points (at least 3)."""
    n = len(pts)
    xs, ys = [float(s) for s, _ in pts], [v for _, v in pts]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
    noise = math.sqrt(sum(r * r for r in resid) / max(1, n - 2))
    return Trend(pts[0][0], pts[-1][0], slope, -slope * (xs[-1] - xs[0]), noise, statistics.median(ys), n)


def late_window(pts, share=0.5, least=4):
    """The last `share` of the points (at least `least`)."""
    return pts[-max(least, int(math.ceil(share * len(pts)))):]


def loss_at(run, step):
    """The logged training loss at `step` (a log-interval record), or None."""
    return next((v for s, v in points(run.train, "loss") if s == step), None)

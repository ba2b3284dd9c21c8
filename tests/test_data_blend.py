import json

import numpy as np
import pytest

from ms_llm.data.blend import BlendStream, check_blend
from ms_llm.data.loader import TrainBatches, eval_batches
from ms_llm.data.manifest import load_manifest
from ms_llm.data.preprocess import preprocess
from ms_llm.errors import UserError

ALPHABETS = {"lower": "abcdefghij", "digits": "0123456789", "upper": "ABCDEFGHIJ"}


def make_dataset(root, name, n_docs, seq_length=16, tokenizer="byte"):
    """Documents written in one alphabet only, so every sample tells which dataset it came from."""
    rng = np.random.default_rng(len(name) * 7 + n_docs)
    letters = np.array(list(ALPHABETS[name]))
    src = root / f"{name}-{seq_length}-{tokenizer}.jsonl"
    with open(src, "w") as f:
        for _ in range(n_docs):
            f.write(json.dumps({"text": "".join(rng.choice(letters, int(rng.integers(30, 300))))}) + "\n")
    out = str(root / f"{name}-{seq_length}-{tokenizer}")
    preprocess(str(src), out, seq_length, tokenizer, 0.2, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    return {"lower": make_dataset(root, "lower", 300), "digits": make_dataset(root, "digits", 60),
            "upper": make_dataset(root, "upper", 120), "root": root}


def origin(batch):
    """Which dataset each sample came from, by its alphabet."""
    out = []
    for row in batch:
        chars = {chr(t) for t in row if t < 256}
        (name,) = [k for k, v in ALPHABETS.items() if chars <= set(v)]
        out.append(name)
    return out


def test_blend_proportions_follow_the_weights(datasets):
    blend = [[0.7, datasets["lower"]], [0.3, datasets["digits"]]]
    m = load_manifest("ignored/when/blending", blend=blend)
    it = TrainBatches("ignored", m, "train", 100, seed=5)
    names = sum((origin(next(it).asnumpy()) for _ in range(100)), [])  # 10,000 samples read
    share = {k: names.count(k) / len(names) for k in ("lower", "digits")}
    assert abs(share["lower"] - 0.7) < 0.01 and abs(share["digits"] - 0.3) < 0.01, share
    # digits (60 documents) is far smaller than its share of 10,000 samples: it repeated, lower did not run out
    n_digits = m["blend"][1]["manifest"]["splits"]["train"]["samples"]
    assert names.count("digits") > 2 * n_digits
    # three datasets, uneven weights: every prefix of the stream stays within a block of its weight
    m3 = load_manifest(None, blend=[[5, datasets["lower"]], [3, datasets["digits"]], [2, datasets["upper"]]])
    comp = BlendStream(m3, "train", 1, 0, 0, True).components(np.arange(10_000))
    assert np.allclose(np.bincount(comp) / 10_000, [0.5, 0.3, 0.2], atol=0.01)
    assert np.allclose(np.bincount(comp[:3_000]) / 3_000, [0.5, 0.3, 0.2], atol=0.01)


def test_blend_is_deterministic_from_the_seed_and_resumes_exactly(datasets):
    blend = [[0.6, datasets["lower"]], [0.25, datasets["digits"]], [0.15, datasets["upper"]]]
    m = load_manifest(None, blend=blend)
    run = TrainBatches(None, m, "train", 8, seed=11)
    full = [next(run).asnumpy() for _ in range(120)]  # past the end of the digits dataset's first epoch
    again = TrainBatches(None, m, "train", 8, seed=11)
    assert all(np.array_equal(next(again).asnumpy(), b) for b in full[:10])
    other = TrainBatches(None, m, "train", 8, seed=12)
    assert not np.array_equal(next(other).asnumpy(), full[0])
    for stop in (37, 81):  # resumed from a checkpoint's single number: samples consumed
        resumed = TrainBatches(None, m, "train", 8, seed=11, consumed=stop * 8)
        assert all(np.array_equal(next(resumed).asnumpy(), full[stop + i]) for i in range(120 - stop))


def test_blend_global_batch_is_the_same_whatever_the_ranks(datasets):
    m = load_manifest(None, blend=[[0.7, datasets["lower"]], [0.3, datasets["digits"]]])
    single = TrainBatches(None, m, "train", 8, dp=1, rank=0, seed=3)
    ranks = [TrainBatches(None, m, "train", 2, dp=4, rank=r, seed=3) for r in range(4)]
    rows = lambda x: sorted(map(tuple, x))  # noqa: E731
    for _ in range(30):
        g = next(single).asnumpy()
        assert rows(np.concatenate([next(r).asnumpy() for r in ranks])) == rows(g)


def test_blend_validation_is_fixed_and_never_repeats_a_sample(datasets):
    m = load_manifest(None, blend=[[0.5, datasets["lower"]], [0.5, datasets["digits"]]])
    val = eval_batches(None, m, 4, 10_000)
    n_digits = m["blend"][1]["manifest"]["splits"]["val"]["samples"]
    assert 0 < len(val) <= 2 * n_digits // 4  # capped where the smaller dataset's validation split ends
    rows = np.concatenate([v.asnumpy() for v in val])
    assert len({tuple(r) for r in rows}) == len(rows)
    again = eval_batches(None, m, 4, 3)
    assert all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(val, again))


def test_blend_refuses_datasets_that_disagree(datasets):
    root = datasets["root"]
    longer = make_dataset(root, "upper", 120, seq_length=32)
    with pytest.raises(UserError, match=r"'.*lower-16-byte' and '.*upper-32-byte' disagree on the sample length.*16 "
                                        r"against 32"):
        load_manifest(None, blend=[[0.5, datasets["lower"]], [0.5, longer]])
    char = make_dataset(root, "upper", 120, tokenizer="char")
    with pytest.raises(UserError, match=r"disagree on the tokenizer: byte against char \(10 characters\)"):
        load_manifest(None, blend=[[0.5, datasets["upper"]], [0.5, char]])


@pytest.mark.parametrize("blend, message", [
    ([], "non-empty list"),
    ([[0.5, "a"], [0, "b"]], r"entry 2 \('b'\) has weight 0"),
    ([["a", 0.5]], r"has the dataset first: write \[weight, dataset_dir\], i.e. \[0.5, a\]"),
    ([[0.5]], r"entry 1 = \[0.5\] must be \[weight, dataset_dir\]"),
    ([[1, "d/x"], [2, "d/x"]], "names 'd/x' twice"),
])
def test_blend_entries_are_checked(blend, message):
    with pytest.raises(UserError, match=message):
        check_blend(blend)


def test_blend_weights_are_normalised():
    assert check_blend([[7, "a"], [3, "b"]]) == [(0.7, "a"), (0.3, "b")]


def test_blend_of_a_missing_dataset_names_it(tmp_path, datasets):
    with pytest.raises(UserError, match="no dataset in '.*nowhere'"):
        load_manifest(None, blend=[[0.5, datasets["lower"]], [0.5, str(tmp_path / "nowhere")]])


@pytest.mark.slow
def test_a_training_run_resumed_mid_blend_equals_an_uninterrupted_one(datasets, tmp_path):
    """The trainer reads data.blend (not dataset_dir), and a stop and --resume in the middle of the mixture
    continues exactly: every logged loss, the validation loss and the final parameters."""
    import os
    import re

    from conftest import ROOT, tiny_train_args
    from ms_llm.config import load_config
    from ms_llm.run_hooks import hooks_for
    from ms_llm.train.trainer import run

    blend = f"data.blend=[[0.7, {datasets['lower']}], [0.3, {datasets['digits']}]]"
    args = ["--set", blend, "--set", "model.seq_length=16", "--set", "train.max_steps=20", "--set",
            "train.log_interval=2", "--set", "train.eval_interval=10", "--set", "checkpoint.save_interval=5",
            "--set", "context.compile_cache=false"]

    def train(run_dir, *extra, resume=False):
        """The console lines of a run trained in this process, as `ms-llm train` trains it (hooks included): a process
        per run would add its import and a compile no cheaper than this one (~2 CPU s for this model)."""
        full = tiny_train_args(datasets["lower"], run_dir, *args, *extra)
        cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                          [full[i + 1] for i, a in enumerate(full) if a == "--set"])
        lines = []
        run(cfg, run_dir=str(run_dir), resume=resume, echo=lambda *a: lines.append(" ".join(map(str, a))),
            hooks=hooks_for(cfg))
        return "\n".join(lines)

    whole = train(tmp_path / "whole")
    train(tmp_path / "cut", "--set", "train.stop_at_step=10")
    resumed = train(tmp_path / "cut", resume=True)
    assert "resuming at step 10" in resumed

    def numbers(run):
        return [(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, open(run / "metrics.jsonl"))
                if "loss" in r or "val_loss" in r]

    assert numbers(tmp_path / "whole") == numbers(tmp_path / "cut")
    train(tmp_path / "lower_only", "--set", "data.blend=null")  # dataset_dir alone: a different run
    assert numbers(tmp_path / "lower_only") != numbers(tmp_path / "whole")
    digest = r"parameter digest \(rank 0\): (\w+)"
    assert re.search(digest, whole).group(1) == re.search(digest, resumed).group(1)

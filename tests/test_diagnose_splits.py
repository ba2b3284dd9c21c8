"""What the validation split says, on synthetic runs: a validation loss that never gets below
the validation split's unigram entropy is too much regularisation (or too small a model, or a frozen part), never
health; validation unlike the training data is a distribution shift, not overfitting; validation holding near-copies
of training text is leakage, whatever the curves look like."""
import json
import math
import os
import random

from test_diagnose import UNIGRAM, VOCAB, finding, healthy, ids, train_only, write_run

H_VAL = 3.34


def with_manifest(run, val_unigram=H_VAL, overlap=None, split_method="token tail of a single document"):
    """Give the run's dataset a validation unigram entropy, a split method and an overlap entry."""
    path = os.path.join(os.path.dirname(run), "_data", "manifest.json")
    m = json.load(open(path))
    m["stats"]["val"] = {"unigram_entropy_nats": val_unigram}
    m["split_method"], m["val_fraction"] = split_method, 0.1
    if overlap is not None:
        m["overlap"] = dict({"shingle_tokens": 32, "val_shingles": 100000, "train_shingles": 900000,
                             "sampled_val_shingles": 100000, "val_shingles_in_train": 0.0,
                             "unigram_kl_val_train_nats": 0.01, "unigram_js_nats": 0.002,
                             "val_tokens_unseen_in_train": 0.0}, **overlap)
    json.dump(m, open(path, "w"))
    return run


def dropout_curve(seed=0):
    """dropout 0.9: training (units dropped) flat at 3.50, validation down to 3.40 by step 200 then flat ~3.42."""
    rng, recs = random.Random(seed), healthy(steps=600, interval=10, eval_interval=50)
    for r in recs:
        if "loss" in r:
            r["loss"] = 3.50 + 0.8 * math.exp(-r["step"] / 40) + rng.gauss(0, 0.02)
        else:
            r["val_loss"] = 3.42 + 0.6 * math.exp(-r["step"] / 40) + rng.gauss(0, 0.004)
    return recs


SHORT = ["train.max_steps=600", "train.log_interval=10", "train.eval_interval=50", "train.warmup_steps=20"]


def test_dropout_09_flat_at_the_unigram_entropy_is_named_with_its_experiment(tmp_path):
    run = with_manifest(write_run(tmp_path / "drop", dropout_curve(), SHORT + ["model.dropout=0.9"]))
    found = ids(run)
    assert "slow_progress" not in found and "overfitting" not in found, found
    f = finding(run, "underfitting")
    assert f.severity == "error" and "context-free level" in f.symptom and f"{H_VAL}" in f.symptom
    assert "model.dropout = 0.9" in f.causes[0] and f.confidence == "high"
    assert any(e.startswith("capacity: 804,224 parameters have seen 460,800 tokens") for e in f.evidence)
    assert any("with dropout 0.9 dropping units" in e and "dropout's noise" in e for e in f.evidence), f.evidence
    assert f.actions[0] == "--set model.dropout=0.1 (now 0.9)"
    experiment = next(a for a in f.actions if a.startswith("the experiment that separates them"))
    assert "--set model.dropout=0" in experiment and "--set train.max_steps=" in experiment
    assert "weight_decay=0" not in experiment  # 0.1 is the usual: not a suspect here


def test_a_strong_weight_decay_comes_first_when_dropout_is_off(tmp_path):
    run = with_manifest(write_run(tmp_path / "wd", dropout_curve(), SHORT + ["train.weight_decay=30",
                                                                             "model.dropout=0.0"]))
    f = finding(run, "underfitting")
    assert "weight decay too strong" in f.causes[0] and f.confidence == "high"
    assert any("train.weight_decay = 30" in e and "% of its size" in e for e in f.evidence)


def test_without_regularisation_a_small_model_or_a_frozen_part(tmp_path):
    run = with_manifest(write_run(tmp_path / "small", dropout_curve(), SHORT + ["model.dropout=0.0"]))
    f = finding(run, "underfitting")
    assert "too small for its data" in f.causes[0] and f.confidence == "medium"
    assert any(a.startswith("the experiment that separates them") and "model.hidden_size=256" in a
               for a in f.actions)
    stats = [{"step": s, "kind": "update_ratio", "name": name, "value": 0.0 if name == "embedding.weight" else 5e-3}
             for s in (100, 200) for name in ("embedding.weight", "layers.0.mlp.up.weight")]
    frozen = with_manifest(write_run(tmp_path / "frozen", dropout_curve(), SHORT + ["model.dropout=0.0"],
                                     stats=stats))
    f = finding(frozen, "underfitting")
    assert "frozen or detached part: embedding.weight" in f.causes[0] and f.confidence == "high"


def test_a_healthy_run_well_below_the_validation_unigram_entropy_is_quiet(tmp_path):
    for seed in range(3):
        run = with_manifest(write_run(tmp_path / f"ok{seed}", healthy(seed=seed)), overlap={})
        assert ids(run) == set(), seed


def shifted_curve():
    """The training loss falls as usual; validation stays 0.6 above it from the first evaluation (0.4 epochs)."""
    recs = healthy(steps=2000, eval_interval=250)
    for r in recs:
        if "val_loss" in r:
            r["val_loss"] += 0.6
    return recs


def test_validation_from_other_text_is_a_shift_not_overfitting(tmp_path):
    run = with_manifest(write_run(tmp_path / "shift", shifted_curve(), ["train.eval_interval=250"],
                                  samples=10 ** 5), overlap={"unigram_kl_val_train_nats": 0.47})
    found = ids(run)
    assert "overfitting" not in found and "labels" not in found and "underfitting" not in found, found
    f = finding(run, "distribution_shift")
    assert "before any sample repeats" in f.symptom and "last 10% of one document" in f.causes[0]
    assert f.confidence == "high"
    assert any("KL(val || train) = 0.47" in e for e in f.evidence)
    assert any("--val-fraction" in a for a in f.actions) and any("separate validation source" in a
                                                                 for a in f.actions)
    assert not any("dropout" in a or "weight_decay" in a for a in f.actions)


def test_the_curve_alone_says_shift_before_the_first_epoch_and_nothing_after_many(tmp_path):
    run = with_manifest(write_run(tmp_path / "curve", shifted_curve(), ["train.eval_interval=250"], samples=10 ** 5))
    f = finding(run, "distribution_shift")
    assert f.confidence == "medium"  # the data did not measure it: a loss computed differently fits too
    assert any("training loss (itself a loss on unseen batches" in e for e in f.evidence)
    many = with_manifest(write_run(tmp_path / "many", shifted_curve(), ["train.eval_interval=250"], samples=3000))
    assert "distribution_shift" not in ids(many)  # after 1 epoch a gap is not evidence of another distribution


def test_a_measured_shift_is_named_even_when_the_curves_agree(tmp_path):
    run = with_manifest(write_run(tmp_path / "data", healthy()), overlap={"unigram_kl_val_train_nats": 0.3})
    f = finding(run, "distribution_shift")
    assert "KL(val || train) = 0.3" in f.symptom


def test_a_large_first_gap_with_a_measured_shift_is_not_blamed_on_labels(tmp_path):
    recs = healthy()
    for r in recs:
        if "val_loss" in r:
            r["val_loss"] += 2.0
    assert "labels" in ids(with_manifest(write_run(tmp_path / "gap", recs)))
    shifted = with_manifest(write_run(tmp_path / "gap_kl", recs), overlap={"unigram_kl_val_train_nats": 0.8})
    assert "labels" not in ids(shifted) and "distribution_shift" in ids(shifted)


def test_leaked_validation_is_named_even_when_it_tracks_training(tmp_path):
    run = with_manifest(write_run(tmp_path / "leak", healthy()), overlap={"val_shingles_in_train": 0.42},
                        split_method="documents by hash")
    f = finding(run, "val_leakage")
    assert "42%" in f.symptom and "no evidence of generalisation" in f.symptom
    assert "near-duplicate documents" in f.causes[0] and f.confidence == "high"
    assert any("validation tracks training" in e for e in f.evidence)
    assert any("near-duplicates" in a for a in f.actions)
    clean = with_manifest(write_run(tmp_path / "clean", healthy()), overlap={"val_shingles_in_train": 0.004})
    assert ids(clean) == set()


def test_a_unigram_entropy_only_for_training_leaves_validation_unjudged(tmp_path):
    run = write_run(tmp_path / "old", dropout_curve(), SHORT + ["model.dropout=0.9"], unigram=UNIGRAM)
    assert "underfitting" not in ids(run)  # no validation reference: not guessed from the training split's

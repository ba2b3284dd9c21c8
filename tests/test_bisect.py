"""`ms-llm debug bisect GOOD BAD` (ms_llm/tune/bisect.py): the search on a metric given by a function of the keys
applied (fast: every case of the search, and its run count), then a real bisect of two tiny configs read back by
`ms-llm diagnose` and the report (slow)."""
import json
import math
import os

import pytest
import yaml

from conftest import tiny_train_args
from ms_llm.errors import UserError
from ms_llm.tune import bisect as bisect_mod


class Scripted(bisect_mod.Bisect):
    """The search with a metric computed from which of BAD's keys a run applies: no training."""

    def __init__(self, diff, metric_of_keys, tmp):
        self.diff = diff
        self.units = bisect_mod.units(diff)
        self.metric, self.steps, self.out, self.echo = "val_loss", 10, str(tmp), lambda *_: None
        self.good_label, self.bad_label, self.good_dir, self.bad_dir = "good", "bad", None, None
        self.runs, self.seconds, self.planned, self.work = [], [], 0, str(tmp)
        self.metric_of_keys = metric_of_keys

    def trial(self, label, applied, reuse=None):
        for r in self.runs:
            if set(r["applied"]) == set(applied):
                return r["metric"]
        value = self.metric_of_keys(set(applied))
        self.runs.append({"label": label, "applied": list(applied), "metric": value, "run_dir": "-", "seconds": 0})
        return value

    def write(self, found):
        return found

    def valid(self, keys):
        return list(keys)


KEYS = [(f"train.k{i}", 0, 1) for i in range(5)]


def scripted(tmp_path, metric, together=()):
    b = Scripted(KEYS, metric, tmp_path)
    b.units = bisect_mod.units(KEYS, together)
    return b.run(), len(b.runs)


def test_one_harmful_key_of_five_is_found_in_about_log2_k_plus_2_runs(tmp_path):
    for culprit in range(5):
        key = f"train.k{culprit}"
        found, runs = scripted(tmp_path, lambda applied, key=key: 2.54 if key in applied else 2.40)
        assert found == [key]
        assert runs <= math.ceil(math.log2(5)) + 2 + 1, (culprit, runs)  # +1: the key found, confirmed alone


def test_two_keys_that_act_only_together_are_reported_as_a_pair(tmp_path):
    found, _ = scripted(tmp_path, lambda a: 2.6 if {"train.k1", "train.k3"} <= a else 2.4)
    assert sorted(found) == ["train.k1", "train.k3"]


def test_two_keys_that_each_explain_part_of_it_are_both_found(tmp_path):
    found, _ = scripted(tmp_path, lambda a: 2.4 + 0.1 * ("train.k0" in a) + 0.1 * ("train.k4" in a))
    assert sorted(found) == ["train.k0", "train.k4"]


def test_keys_that_change_together_are_applied_as_one(tmp_path):
    def metric(applied):
        assert ("train.k1" in applied) == ("train.k2" in applied), applied  # never one without the other
        return 2.6 if "train.k2" in applied else 2.4
    found, _ = scripted(tmp_path, metric, together=[("train.k1", "train.k2")])
    assert sorted(found) == ["train.k1", "train.k2"]


def test_a_difference_below_the_noise_explains_nothing(tmp_path):
    found, runs = scripted(tmp_path, lambda a: 2.4 + 0.001 * len(a))
    assert found == [] and runs == 2


def test_two_sides_with_the_same_config_are_refused_in_one_paragraph(tmp_path):
    from conftest import ROOT

    config = os.path.join(ROOT, "configs", "shakespeare_char.yaml")
    with pytest.raises(UserError, match="resolve to the same config"):
        bisect_mod.bisect(config, config, steps=10, out=str(tmp_path), echo=lambda *_: None)
    with pytest.raises(UserError, match="does not exist"):
        bisect_mod.bisect(str(tmp_path / "nope"), config, steps=10, out=str(tmp_path), echo=lambda *_: None)


def cli(capsys, *args):
    """stdout of `ms-llm ARGS` run through the CLI's main in this process (the bisect's runs are processes of their
    own all the same: the launcher starts them), asserting exit 0."""
    from ms_llm.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    assert code == 0, out.out[-1500:] + out.err[-3000:]
    return out.out


@pytest.mark.slow
def test_a_real_bisect_names_the_harmful_key_and_diagnose_and_the_report_read_it(dataset, tmp_path, capsys):
    good = tmp_path / "good.yaml"
    # the compile cache on (the default): the runs at GOOD's learning rate share one compiled step, those at BAD's
    # another (the other keys that differ are host-side)
    args = tiny_train_args(dataset, tmp_path / "unused", "--set", "train.max_steps=60")
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    from ms_llm.config import load_config, save_config

    save_config(load_config(args[2], overrides), str(good))
    bad = tmp_path / "bad.yaml"
    cfg = yaml.safe_load(open(good))
    cfg["train"]["lr"] = 1e-5                # harmful: 1/100 of the recipes' LR, the loss barely moves in 60 steps
    cfg["train"]["min_lr"] = 1e-6
    cfg["train"]["log_interval"] = 20        # harmless: a cadence
    cfg["monitor"]["telemetry_interval_s"] = None
    yaml.safe_dump(cfg, open(bad, "w"))
    out = tmp_path / "bisect"
    text = cli(capsys, "debug", "bisect", good, bad, "--steps", "60", "--output", out)
    assert "plan:" in text and "4 setting(s) differ" in text
    doc = json.load(open(out / "bisect.json"))
    assert sorted(doc["found"][0]["keys"]) == ["train.lr", "train.min_lr"], text
    # train.lr 1e-5 alone is below GOOD's min_lr: the bisect applies the min_lr the refusal names with it
    assert text.strip().splitlines()[-1].startswith("bisect: train.lr (0.001 → 1e-05) with train.min_lr (0.0001 → "
                                                    "1e-06) explain val_loss"), text
    assert len(doc["runs"]) <= 2 + math.ceil(math.log2(4)) + 2
    # the same command again reuses every run (an interrupted bisect resumes)
    again = cli(capsys, "debug", "bisect", good, bad, "--steps", "60", "--output", out)
    assert "GOOD + BAD's" not in again and "explain val_loss" in again
    # diagnose reads it as a measured cause; the report shows its table
    run_dir = doc["runs"][1]["run_dir"]
    with open(os.path.join(run_dir, "bisect.json"), "w") as f:
        json.dump(doc, f)
    from ms_llm.cli import main

    main(["diagnose", run_dir, "--no-measure"])  # its exit code is the run's findings', not under test here
    diag = capsys.readouterr().out
    assert "measured: train.lr (0.001 → 1e-05) and train.min_lr (0.0001 → 1e-06) together explain val_loss" \
        in diag, diag
    cli(capsys, "report", run_dir, "-o", tmp_path / "r.html")
    assert "Bisect</h2>" in open(tmp_path / "r.html").read()

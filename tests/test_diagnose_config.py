"""`ms-llm diagnose` reads the configuration and the run's history, not only the curves: settings judged
against published recipes (ms_llm/diagnose/recipes.py) and against what the data supports, tied to what they did
in the curves; the keys a resume changed; one recovered record that is not an explosion; throughput under host
contention; the measured what-if (--measure). Synthetic run directories (the files a training run leaves), so each
rule's logic is checked in milliseconds; tests/faults/test_faults_settings.py runs the real faults."""
import json
import math
import os
import random

import pytest

from ms_llm.cli import main
from ms_llm.diagnose import recipes
from ms_llm.diagnose.engine import diagnose
from test_diagnose import VOCAB, finding, healthy, ids, train_only, write_run

VAL_H = 3.337   # the validation split's unigram entropy (Tiny Shakespeare's last 10%)
TRAIN_H = 3.309


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MS_LLM_CACHE", str(tmp_path / "cache"))


def with_manifest(run, **fields):
    """Give the run's dataset folder the manifest fields preprocessing writes (both splits' unigram entropies, the
    largest id, the sample length, the document-length histogram)."""
    from ms_llm.rundir.reader import load_run

    d = load_run(run).cfg("data.dataset_dir")
    path = os.path.join(d, "manifest.json")
    m = json.load(open(path))
    m["stats"] = {"train": {"unigram_entropy_nats": TRAIN_H, "doc_length_histogram": {"1,048,576-2,097,151": 1}},
                  "val": {"unigram_entropy_nats": VAL_H}}
    m.update({"max_token_id": VOCAB - 1, "seq_length": 64}, **fields)
    json.dump(m, open(path, "w"))
    return run


def alarms(found):
    return [f for f in found if f.severity != "info"]


def near_context_free(steps=300, interval=10, eval_interval=100, seed=0):
    """A run that learns almost nothing beyond token frequencies: training 3.9 → 3.15 (slowly), validation at about
    its split's unigram entropy."""
    rng, out = random.Random(seed), []
    for step in range(interval, steps + 1, interval):
        loss = 3.12 + 0.8 * math.exp(-step / 60) + rng.gauss(0, 0.01)
        out.append({"step": step, "loss": loss, "lr": 1e-3, "grad_norm": 0.8 + rng.gauss(0, 0.05),
                    "loss_scale": 65536.0, "skipped_interval": 0, "skipped": 0, "tokens_per_s": 15000 * (1 + rng.gauss(0, 0.02)), "mfu": 0.4,
                    "mem_gib": 0.8, "data_wait_frac": 0.01})
        if step % eval_interval == 0:
            out.append({"step": step, "val_loss": 3.30 + 0.4 * math.exp(-step / 60), "val_tokens": 111360})
    return out


QUICK = ["train.max_steps=300", "train.log_interval=10", "train.eval_interval=100"]


# --- the reference table ---------------------------------------------------------------------------------

def test_every_recipe_value_has_a_source_and_the_spans_are_what_the_recipes_say():
    from ms_llm.diagnose import priors

    assert all(e.source and e.values for e in priors.entries())
    assert recipes.span("dropout") == (0.0, 0.2) and recipes.span("weight_decay") == (0.1, 0.1)
    assert recipes.span("clip_grad") == (1.0, 1.0) and recipes.span("beta2") == (0.95, 0.99)
    text = recipes.cite("dropout")
    assert "nanoGPT shakespeare-char 0.2" in text and "nanogpt.yaml" in text
    lo, hi, near = recipes.lr_reference(800_000)  # below the smallest recipe: nanoGPT's char model stands for it
    assert (lo, hi) == (1e-3, 1e-3) and near[0].name == "nanoGPT shakespeare-char"
    lo, hi, near = recipes.lr_reference(7e9)  # GPT-3 6.7B's 1.2e-4 to LLaMA / Llama 2 7B's 3e-4
    assert lo == 1e-4 and hi == 3e-4 and {"Llama 2 7B", "LLaMA 7B", "GPT-3 6.7B"} <= {r.name for r in near}


# --- class 1: a setting far from any recipe, tied to what it did --------------------------------------------

def test_dropout_09_at_the_context_free_level_is_named_first_with_its_reference(tmp_path):
    run = with_manifest(write_run(tmp_path / "drop", near_context_free(), QUICK + ["model.dropout=0.9"]))
    found = diagnose(run)[1]
    first = alarms(found)[0]
    assert first.id == "config_dropout", [(f.id, f.symptom) for f in found]
    assert "model.dropout = 0.9" in first.causes[0] and first.confidence == "high"
    assert any("nanoGPT shakespeare-char 0.2" in e and "Srivastava et al. 2014" in e for e in first.evidence)
    assert any("of the validation split's unigram entropy" in e for e in first.evidence)  # what it did
    assert first.actions[0].startswith("--set model.dropout=0.1")
    assert any(a.startswith("the experiment that separates it: ms-llm train") and "model.dropout=0.1" in a
               for a in first.actions)


def test_a_symptom_the_dropout_explains_names_it_first(tmp_path):
    """Validation above training before an epoch (distribution_shift's curve evidence) with dropout 0.9: the
    dropout is the first cause of that finding too, not the split."""
    recs = near_context_free()
    for r in recs:
        if "val_loss" in r:
            r["val_loss"] += 0.1
    run = with_manifest(write_run(tmp_path / "drop", recs, QUICK + ["model.dropout=0.9"], samples=15685))
    found = diagnose(run)[1]
    for f in alarms(found):
        assert "model.dropout" in f.causes[0], (f.id, f.causes)


def test_a_weight_decay_far_above_the_recipes_is_tied_to_the_same_evidence(tmp_path):
    """Any setting that slows learning is judged on the same evidence when no progress rule fires."""
    run = with_manifest(write_run(tmp_path / "wd", near_context_free(), QUICK + ["train.weight_decay=10"]))
    first = alarms(diagnose(run)[1])[0]
    assert first.id == "config_weight_decay" and "train.weight_decay = 10" in first.causes[0]
    assert any("GPT-3" in e and " 0.1" in e and "gpt3.yaml" in e for e in first.evidence)


def test_the_same_dropout_on_a_run_that_learns_is_a_note_that_did_nothing_visible(tmp_path):
    run = with_manifest(write_run(tmp_path / "ok", healthy(), ["model.dropout=0.9"]))
    f = finding(run, "config_dropout")
    assert f.severity == "info" and any("did nothing visible" in e for e in f.evidence)
    assert not alarms(diagnose(run)[1])


def test_a_learning_rate_far_above_the_recipes_stalls_at_the_context_free_level(tmp_path):
    run = with_manifest(write_run(tmp_path / "lr", near_context_free(), QUICK + ["train.lr=0.1"]))
    f = finding(run, "config_lr")
    assert f.severity == "warning" and "100x" in f.symptom and "train.lr = 0.1" in f.causes[0]
    assert any("nanoGPT shakespeare-char 0.001" in e for e in f.evidence)


def test_no_warmup_at_a_high_lr_is_named_first_in_the_divergence(tmp_path):
    recs = train_only(healthy())
    for r in recs:
        if r["step"] > 100:
            r["loss"] = min(6.0, 2.8 + 0.03 * (r["step"] - 100))
    run = with_manifest(write_run(tmp_path / "warm", recs, ["train.lr=5e-3", "train.warmup_steps=0"]))
    f = finding(run, "divergence")
    assert f.causes[0].startswith("no warmup at a high LR") and f.confidence == "high", f.causes
    assert finding(run, "config_warmup_none").severity == "warning"


def test_a_vocabulary_far_larger_than_the_data_shows_in_the_start_and_the_head(tmp_path):
    recs = healthy()
    recs[0]["initial_loss"] = math.log(50304) + 0.05
    run = with_manifest(write_run(tmp_path / "vocab", recs, ["model.vocab_size=50304"]))
    f = finding(run, "config_vocab")
    assert f.severity == "warning" and "50,304" in f.causes[0]
    assert any("ln(50,304)" in e for e in f.evidence) and any("of each step's FLOPs" in e for e in f.evidence)
    assert any("max_token_id = 65" in e for e in f.evidence)  # the reference: what the data holds
    assert f.actions[0].startswith("--set model.vocab_size=null")


def test_a_context_shorter_than_the_samples_cuts_the_data(tmp_path):
    run = with_manifest(write_run(tmp_path / "ctx", healthy(), ["model.seq_length=16"]), seq_length=256)
    f = finding(run, "config_context_short")
    assert f.severity == "warning" and "93%" in f.causes[0]


def test_healthy_runs_get_no_config_alarm(tmp_path):
    for seed in range(3):
        run = with_manifest(write_run(tmp_path / f"h{seed}", healthy(seed=seed)))
        assert diagnose(run)[1] == [], seed


# --- class 2: what changed at a resume ------------------------------------------------------------------------

def resumed(tmp_path, name, recs, change=(), at=1000):
    """A run stopped at `at` and resumed with `change` (--set overrides): config.resume_<at>.yaml as the trainer
    writes it, and the resume event."""
    from ms_llm.config import load_config, save_config

    recs = recs + [{"step": at, "event": "resume", "from": f"step_{at:08d}.ckpt"}]
    run = with_manifest(write_run(tmp_path / name, sorted(recs, key=lambda r: r["step"])))
    cfg = load_config(os.path.join(run, "config.yaml"), list(change))
    save_config(cfg, os.path.join(run, f"config.resume_{at}.yaml"))
    return run


def test_a_spike_right_after_a_resume_that_raised_the_lr_names_the_change_not_bad_batches(tmp_path):
    recs = healthy()
    for r in recs:
        if "loss" in r and r["step"] in (1050, 1100):
            r["loss"] *= 1.5
            r["lr"] = 1e-2
    run = resumed(tmp_path, "lr", recs, ["train.lr=1e-2"])
    found = diagnose(run)[1]
    f = finding(run, "resume_change")
    assert "jumped at the resume at step 1000" in f.symptom and "train.lr 0.001 → 0.01" in f.symptom
    assert f.causes[0].startswith("the resume at step 1000 changed train.lr") and f.confidence == "high"
    assert f.actions[0] == "resume with train.lr as before: --set train.lr=0.001"
    spikes = next(x for x in found if x.id == "loss_spikes")
    assert "resume at step 1000 changed train.lr" in spikes.causes[0], spikes.causes  # not "bad batches"
    assert alarms(found)[0].id in ("resume_change", "config_lr")


def test_a_resume_that_changed_nothing_but_jumps_names_the_resume_itself(tmp_path):
    recs = healthy()
    for r in recs:
        if "loss" in r and r["step"] == 1050:
            r["loss"] *= 1.3
    run = resumed(tmp_path, "same", recs)
    f = finding(run, "resume_change")
    assert "the config did not change" in f.symptom and f.causes[0].startswith("the resume at step 1000 itself")


def test_a_change_that_did_nothing_visible_is_a_note(tmp_path):
    run = resumed(tmp_path, "quiet", healthy(), ["train.eval_interval=250", "checkpoint.keep_last=5"])
    f = finding(run, "resume_change")
    assert f.severity == "info" and any("did nothing visible" in e for e in f.evidence)
    assert not alarms(diagnose(run)[1])


def test_an_lr_jump_the_loss_does_not_react_to_is_a_note(tmp_path):
    """Extending a run (train.max_steps) recomputes the schedule: the logged LR jumps, the loss goes on falling."""
    recs = healthy()
    for r in recs:
        if "loss" in r and r["step"] > 1000:
            r["lr"] = 2e-3
    run = resumed(tmp_path, "longer", recs, ["train.max_steps=4000"])
    f = finding(run, "resume_change")
    assert f.severity == "info" and any("the logged LR went" in e for e in f.evidence)
    assert not alarms(diagnose(run)[1])


def test_a_plateau_from_a_resume_that_raised_the_weight_decay(tmp_path):
    recs = healthy()
    for r in recs:
        if "loss" in r and r["step"] > 1000:
            r["loss"] = 1.837 + 0.002 * math.sin(r["step"])
    run = resumed(tmp_path, "wd", recs, ["train.weight_decay=10"])
    f = finding(run, "resume_change")
    assert "loss stalled" in f.symptom and "train.weight_decay 0.1 → 10" in f.causes[0]


def test_a_speed_change_at_a_resume_names_the_changed_threads(tmp_path):
    recs = healthy()
    for r in recs:
        if "loss" in r and r["step"] > 1000:
            r["tokens_per_s"] = 7000
    run = resumed(tmp_path, "speed", recs, ["context.num_threads=1"])
    f = finding(run, "resume_change")
    assert "another speed" in f.symptom and "context.num_threads null → 1" in f.causes[0]


# --- class 4: one record the run recovers from is not an explosion ----------------------------------------

def flag(step, value=1.93):
    return {"step": step, "kind": "flag", "flag": "exploding", "name": "gradient norm",
            "detail": f"{value} vs mean 1.11 ± 0.1 of the last 50 records"}


def test_one_recovered_gradient_norm_record_at_the_end_of_warmup_is_a_note(tmp_path):
    recs = healthy()
    run = write_run(tmp_path / "once", recs, ["train.warmup_steps=100"], stats=[flag(98)])
    f = finding(run, "stats_exploding")
    assert f.severity == "info" and any("warmup reaches the peak LR" in e for e in f.evidence)
    assert main(["diagnose", run]) == 0


def test_a_gradient_norm_that_stays_up_is_an_explosion(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        if r["step"] >= 1000:
            r["grad_norm"] = 12.0
    run = write_run(tmp_path / "up", recs, stats=[flag(1000, 12.0)])
    assert finding(run, "stats_exploding").severity == "warning"
    persistent = write_run(tmp_path / "twice", healthy(), stats=[flag(500), flag(1200)])
    assert finding(persistent, "stats_exploding").severity == "warning"


def test_one_recovered_loss_spike_is_a_note_and_two_are_a_finding(tmp_path):
    recs = healthy()
    for r in recs:
        if r["step"] == 700 and "loss" in r:
            r["loss"] *= 1.4
    run = write_run(tmp_path / "one", recs)
    f = finding(run, "loss_spikes")
    assert f.severity == "info" and "recovered" in f.symptom
    assert ids(run) == {"loss_spikes"} and main(["diagnose", run]) == 0


# --- class 5: contention --------------------------------------------------------------------------------

def busy_telemetry(run, t0, t1, other=1.0, cores=2):
    """Telemetry of a host where other processes kept `other` cores busy beside the run (host busy time and the
    run's own, as the sampler records them)."""
    with open(os.path.join(run, "telemetry.jsonl"), "w") as f:
        for t in range(int(t0), int(t1) + 31, 30):
            f.write(json.dumps({"time": t, "cpu_util_pct": 100.0, "proc_cpu_pct": 100 * (cores - other),
                                "cpu_count": cores, "load1": 1.9, "rss_gib": 0.7}) + "\n")


def saw(recs):
    t = 1.8e9
    for i, r in enumerate(recs):
        r["time"] = t + r["step"] * 0.05
        if "loss" in r:
            r["ms_per_step"], r["eta_s"] = 50.0, 0.0
            r["tokens_per_s"] = 15000 if i % 2 else 6000
    return recs


def test_uneven_throughput_beside_a_busy_process_yields_to_the_fault(tmp_path):
    """The load average stays under 1.5x the cores (one busy process on 2 cores), but the other process's CPU is
    measured: the throughput finding is a note, and the run's own fault comes first."""
    recs = saw(healthy())
    for r in train_only(recs):
        if r["step"] > 1200:
            r["loss"] = 2.4 + 0.01 * (r["step"] - 1200)  # the fault: a divergence
    run = write_run(tmp_path / "busy", recs)
    busy_telemetry(run, 1.8e9, 1.8e9 + 100)
    found = diagnose(run)[1]
    assert alarms(found)[0].id == "divergence"
    note = finding(run, "host_contention")
    assert note.severity == "info" and any("other processes kept 1.0 of the host's 2 cores" in e
                                           for e in note.evidence)
    assert any("not the run's" in e for e in note.evidence)
    assert "throughput_uneven" not in {f.id for f in found}


def test_a_moderate_data_wait_beside_a_busy_process_is_a_note_and_a_stall_stays_a_finding(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        r["data_wait_frac"] = 0.15
    run = write_run(tmp_path / "wait", saw(recs))
    busy_telemetry(run, 1.8e9, 1.8e9 + 100)
    assert finding(run, "data_wait").severity == "info"
    for r in train_only(recs):
        r["data_wait_frac"] = 0.6  # a pipeline that stalls on its own
    stall = write_run(tmp_path / "stall", recs)
    busy_telemetry(stall, 1.8e9, 1.8e9 + 100)
    assert finding(stall, "data_wait").severity == "warning"


def test_a_clean_run_beside_a_busy_process_raises_no_warning(tmp_path):
    run = write_run(tmp_path / "clean", saw(healthy()))
    busy_telemetry(run, 1.8e9, 1.8e9 + 100)
    assert not alarms(diagnose(run)[1])
    alone = write_run(tmp_path / "alone", saw(healthy()))  # the same stalls, no other process: the run's own
    busy_telemetry(alone, 1.8e9, 1.8e9 + 100, other=0.1)
    assert "throughput_uneven" in {f.id for f in alarms(diagnose(alone)[1])}


# --- class 3: the measured what-if ----------------------------------------------------------------------

def measured(run, rows, steps=20):
    from ms_llm.diagnose.measure import FORMAT, MEASURE_FILE

    json.dump({"format": FORMAT, "steps": steps, "duration_s": 31.0, "results": rows},
              open(os.path.join(run, MEASURE_FILE), "w"))


def row(name, tps, sets=(), other=0.1, rnd=1):
    return {"name": name, "sets": list(sets), "what": name, "tokens_per_s": tps, "seconds": 5.0, "other_cores": other,
            "round": rnd}


def test_a_measured_faster_setting_is_named_with_every_measurement(tmp_path):
    run = write_run(tmp_path / "accum", healthy(), ["train.micro_batch_size=2"])
    measured(run, [row("as run", 8300), row("micro-batch 12 (accumulation 1)", 14200, ["train.micro_batch_size=12"]),
                   row("threads 1", 8100, ["context.num_threads=1"]), row("as run", 8500, rnd=2),
                   row("micro-batch 12 (accumulation 1)", 13900, ["train.micro_batch_size=12"], rnd=2),
                   row("threads 1", 7900, ["context.num_threads=1"], rnd=2)])
    f = finding(run, "throughput_left")
    assert f.severity == "warning" and "micro-batch 12 (accumulation 1)" in f.symptom and "1.67x" in f.symptom
    assert f.actions[0].startswith("--set train.micro_batch_size=12")
    assert any("threads 1" in e and "8,100, 7,900 tokens/s by round = 0.98x, 0.93x" in e for e in f.evidence)


def test_the_combined_run_winning_leaves_the_single_settings_as_the_causes(tmp_path):
    """Every faster setting at once (measure's "together" round) can be the fastest: the symptom and the action are
    the combination's, the first cause is still the single setting with the largest factor, and the combination
    follows as a cause of its own."""
    run = write_run(tmp_path / "both", healthy(), ["train.micro_batch_size=2"])
    both = ["train.micro_batch_size=8", "context.num_threads=1"]
    rows = []
    for rnd, (own, micro, threads, together) in enumerate([(8000, 20000, 9600, 27000), (8200, 21000, 9900, 28000)], 1):
        rows += [row("as run", own, rnd=rnd), row("micro-batch 8 (accumulation 1)", micro,
                                                  ["train.micro_batch_size=8"], rnd=rnd),
                 row("threads 1", threads, ["context.num_threads=1"], rnd=rnd),
                 row("together: micro-batch 8 (accumulation 1), threads 1", together, both, rnd=rnd)]
    measured(run, rows)
    f = finding(run, "throughput_left")
    assert f.severity == "warning" and f.symptom.startswith("throughput left on the table: together: ")
    assert f.actions[0].startswith("--set train.micro_batch_size=8 --set context.num_threads=1")
    assert f.causes[0].startswith("micro-batch 8 (accumulation 1): 2.53x")
    assert f.causes[0].endswith("[confidence: high]")
    assert f.causes[1].startswith("threads 1: 1.20x") and f.causes[2].startswith("together: ")
    assert all(c.endswith("[confidence: medium]") for c in f.causes[1:])


def test_a_setting_faster_in_one_round_only_is_not_named(tmp_path):
    run = write_run(tmp_path / "noise", healthy())
    measured(run, [row("as run", 8000), row("micro-batch 6 (accumulation 2)", 10900, ["train.micro_batch_size=6"]),
                   row("as run", 9500, rnd=2), row("micro-batch 6 (accumulation 2)", 9000, ["train.micro_batch_size=6"],
                                                   rnd=2)])
    # 1.36x in the first round, 0.95x in the second: the host, not the setting
    f = finding(run, "throughput_measured")
    assert f.severity == "info" and "none runs the step faster" in f.symptom and "in every round" in f.symptom


def test_fewer_threads_winning_while_other_processes_hold_the_cores_is_a_note(tmp_path):
    run = write_run(tmp_path / "threads", healthy())
    measured(run, [row("as run", 7000, other=1.7), row("threads 1", 13000, ["context.num_threads=1"], other=1.7),
                   row("as run", 7300, other=1.7, rnd=2),
                   row("threads 1", 11000, ["context.num_threads=1"], other=1.7, rnd=2)])
    f = finding(run, "throughput_left")
    assert f.severity == "info" and "shared with other processes" in f.symptom
    assert any("measure again on an idle host" in e for e in f.evidence)
    idle = write_run(tmp_path / "idle", healthy())  # the same figures on an idle host: the setting's own
    measured(idle, [row("as run", 7000), row("threads 1", 13000, ["context.num_threads=1"]), row("as run", 7300)])
    assert finding(idle, "throughput_left").severity == "warning"


def test_the_variants_keep_the_global_batch_and_name_what_they_change(tmp_path):
    from ms_llm.diagnose.measure import variants
    from ms_llm.rundir.reader import load_run

    run = load_run(write_run(tmp_path / "v", healthy(), ["train.micro_batch_size=2", "context.num_threads=1",
                                                         "context.cpu_kernels=false", "monitor.tensor_stats.every=10"]))
    names = {n: sets for n, sets, _ in variants(run)}
    assert names["micro-batch 12 (accumulation 1)"] == ["train.micro_batch_size=12"]
    assert names["threads 2"] == ["context.num_threads=2"] and names["cpu kernels on"] == ["context.cpu_kernels=true"]
    assert names["tensor statistics off"] == ["monitor.tensor_stats=null"]
    assert all("global_batch_size" not in s for sets in names.values() for s in sets)

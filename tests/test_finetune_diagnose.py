"""`ms-llm diagnose` on fine-tuning runs (rules/finetune.py), on synthetic run directories: a mask that keeps almost
nothing, a loss that counts the prompts, drift from the base model; and silence on a healthy fine-tuning run."""
import json
import math
import os

from ms_llm.diagnose.engine import diagnose

from synthetic_run import make_run

SHARE = 0.38  # the dataset's share of response tokens


def finetune_run(path, frac=SHARE, prompt=None, extra=None, overrides=(), truncated=0, share=SHARE, data_seq=64):
    """A 600-step synthetic run made into a fine-tuning run: loss_tokens_frac on its log records, evaluations every
    100 steps with val_loss (responses) falling, val_loss_prompt from `prompt(i)` and extra_val_loss from `extra(i)`
    (i = evaluation index), and the chat dataset's facts in run_info.json."""
    make_run(path, steps=600, eval_interval=100, overrides=["model.vocab_size=512", *overrides], events=False,
             telemetry=False)
    lines = [json.loads(x) for x in open(os.path.join(path, "metrics.jsonl"))]
    out, i = [], 0
    for r in lines:
        if "val_loss" in r:
            r["val_loss"] = 3.0 - 0.1 * i
            r["val_loss_prompt"] = prompt(i) if prompt else 3.6 - 0.03 * i
            if extra:
                r["extra_val_loss"] = extra(i)
            i += 1
        elif "loss" in r:
            r["loss_tokens_frac"] = frac(r["step"]) if callable(frac) else frac
        out.append(r)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    info = json.load(open(os.path.join(path, "run_info.json")))
    info["dataset"] = {"dir": "/data/chat", "format": "chat", "packed": True,
                       "finetune": {"train": {"conversations": 900, "samples": 300, "tokens": 60000,
                                              "loss_tokens": int(share * 60000), "fill_rate": 0.8,
                                              "loss_fraction": share},
                                    "truncated": truncated, "dropped": 0}, "seq_length": data_seq}
    json.dump(info, open(os.path.join(path, "run_info.json"), "w"))
    return str(path)


def ids(path):
    return {f.id: f for f in diagnose(path)[1]}


def test_a_healthy_fine_tuning_run_has_no_fine_tuning_finding(tmp_path):
    found = ids(finetune_run(tmp_path / "ok", extra=lambda i: 2.5 - 0.01 * i))
    assert not {"loss_mask_empty", "prompt_in_loss", "base_drift"} & set(found), list(found)


def test_a_mask_that_keeps_almost_nothing_is_an_error_naming_the_cut_conversations(tmp_path):
    found = ids(finetune_run(tmp_path / "empty", frac=lambda s: 0.0 if s % 20 == 0 else 0.004, truncated=850,
                             share=0.005))
    f = found["loss_mask_empty"]
    assert f.severity == "error" and "computed on almost nothing" in f.symptom
    assert "850 were cut" in f.causes[0] and f.confidence == "high"
    assert any("no token at all" in e for e in f.evidence) and any("--seq-length" in a for a in f.actions)
    assert "labels" not in found  # a near-zero loss here is the mask's, not a label bug's


def test_a_run_reading_shorter_samples_than_the_dataset_is_named_first(tmp_path):
    """The dataset keeps 38% of its tokens, the run's loss counts 0.4%: the run cuts the samples
    (model.seq_length 64 < the dataset's 256), where the responses are."""
    f = ids(finetune_run(tmp_path / "short", frac=0.004, data_seq=256))["loss_mask_empty"]
    assert "model.seq_length = 64" in f.causes[0] and f.confidence == "high"
    assert any(a.startswith("--set model.seq_length=256") for a in f.actions)


def test_a_loss_over_the_prompts_is_named_from_the_config_and_the_counts(tmp_path):
    found = ids(finetune_run(tmp_path / "off", frac=0.99, overrides=["finetune.loss_mask=false"],
                             prompt=lambda i: 3.6 - 0.35 * i))
    f = found["prompt_in_loss"]
    assert f.symptom == "the loss counts the prompts" and f.confidence == "high"
    assert any("99.0% of the target tokens" in e and "38.0%" in e for e in f.evidence)
    assert f.actions[0].startswith("--set finetune.loss_mask=true")
    # the config says the mask is on, yet the loss counted nearly every token: the counts alone name it
    f = ids(finetune_run(tmp_path / "on", frac=0.99))["prompt_in_loss"]
    assert f.symptom == "the loss counts the prompts"
    assert "the mask is on, yet the loss counted nearly every token" in f.evidence


def test_prompt_loss_falling_faster_than_the_responses_gives_two_causes_and_the_experiment(tmp_path):
    """The mask is on and applied: the finding is a warning with two medium causes and the cheap check that
    separates them."""
    found = ids(finetune_run(tmp_path / "fast", prompt=lambda i: 3.6 - 0.4 * i))
    f = found["prompt_in_loss"]
    assert "falls faster" in f.symptom and [c.endswith("[confidence: medium]") for c in f.causes] == [True, True]
    assert any("compare loss_tokens_frac" in a for a in f.actions)


def test_drift_from_the_base_model_while_the_loss_falls(tmp_path):
    found = ids(finetune_run(tmp_path / "drift", extra=lambda i: 2.5 + 0.08 * i))
    f = found["base_drift"]
    assert "plain-text validation rising (2.5 → 2.9)" in f.symptom and f.confidence == "high"
    assert any("finetune.lora.rank" in a for a in f.actions) and any("lowest at step 100" in a for a in f.actions)
    assert not math.isnan(f.steps[0])

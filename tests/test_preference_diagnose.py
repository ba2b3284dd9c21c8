"""`ms-llm diagnose` on preference runs (rules/preference.py), on synthetic run directories: likelihood displacement,
pairs too easy, flat margins, a reference that is not the policy's start; and silence on a healthy run."""
import json
import os

from ms_llm.diagnose.engine import diagnose

from synthetic_run import make_run

RULES = {"likelihood_displacement", "pairs_too_easy", "margins_flat", "reference_mismatch"}


def healthy(step):
    """Margins rising from 0, accuracies climbing over tens of steps, chosen log-prob flat."""
    k = step / 200
    return {"rewards/chosen": 0.05 * k, "rewards/rejected": -0.3 * k, "rewards/accuracies": min(0.9, 0.5 + 0.4 * k),
            "rewards/margins": 0.35 * k, "logps/chosen": -120.0 + 0.5 * k, "logps/rejected": -125.0 - 3 * k}


def preference_run(path, metrics=healthy, steps=200, log_interval=1, overrides=(), lengths=(90.0, 88.0)):
    make_run(path, steps=steps, log_interval=log_interval, eval_interval=50,
             overrides=["model.vocab_size=512", "finetune.preference.loss=dpo", *overrides], events=False,
             telemetry=False)
    lines = [json.loads(x) for x in open(os.path.join(path, "metrics.jsonl"))]
    for r in lines:
        if "loss" in r:
            r.update(metrics(r["step"]) if r["step"] > 1 else dict(metrics(1), **{
                "rewards/chosen": metrics(1).get("ref_c", 0.0), "rewards/rejected": metrics(1).get("ref_r", 0.0),
                "rewards/margins": 0.0, "rewards/accuracies": 0.0}))
            r.pop("ref_c", None), r.pop("ref_r", None)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
    info = json.load(open(os.path.join(path, "run_info.json")))
    info["dataset"] = {"dir": "/data/pairs", "format": "preference",
                       "preference": {"train": {"pairs": 800, "mean_chosen_length": lengths[0],
                                                "mean_rejected_length": lengths[1]}}}
    json.dump(info, open(os.path.join(path, "run_info.json"), "w"))
    return str(path)


def found(path):
    return {f.id: f for f in diagnose(path)[1]}


def test_a_healthy_preference_run_has_no_preference_finding(tmp_path):
    assert not RULES & set(found(preference_run(tmp_path / "ok")))


def test_chosen_log_prob_falling_while_margins_rise_is_likelihood_displacement(tmp_path):
    def displaced(step):
        k = step / 200
        return dict(healthy(step), **{"logps/chosen": -120.0 - 20 * k, "logps/rejected": -125.0 - 45 * k,
                                      "rewards/margins": 2.5 * k})
    f = found(preference_run(tmp_path / "d", displaced))["likelihood_displacement"]
    assert "less likely" in f.symptom and f.confidence == "high"  # the rejected one fell faster: displacement
    assert any("fell faster" in e for e in f.evidence)
    assert len(f.causes) == 2 and "cheapest experiment" in f.actions[0] and "train.lr" in f.actions[0]


def test_accuracy_at_one_within_a_few_steps_names_length_when_the_lengths_differ(tmp_path):
    def easy(step):
        return dict(healthy(step), **{"rewards/accuracies": 1.0})
    f = found(preference_run(tmp_path / "e", easy, lengths=(180.0, 60.0)))["pairs_too_easy"]
    assert "separable by length" in f.causes[0] and f.confidence == "high"
    f = found(preference_run(tmp_path / "e2", easy))["pairs_too_easy"]  # equal lengths: two causes + the experiment
    assert len(f.causes) == 2 and f.confidence == "medium" and any("cheapest experiment" in a for a in f.actions)


def test_flat_margins_say_beta_when_the_policy_moved_and_lr_when_it_did_not(tmp_path):
    def small_beta(step):  # margins 0.02 with β = 0.01: log-ratio margin of 2 nats
        return dict(healthy(step), **{"rewards/margins": 0.02 * min(1, step / 20)})
    f = found(preference_run(tmp_path / "b", small_beta, overrides=["finetune.preference.beta=0.01"]))["margins_flat"]
    assert "beta too small" in f.causes[0] and f.confidence == "high"
    def still(step):
        return dict(healthy(step), **{"rewards/margins": 0.001})
    f = found(preference_run(tmp_path / "l", still))["margins_flat"]
    assert "learning rate is too low" in f.causes[0] and any("train.lr=" in a for a in f.actions)


def test_rewards_not_zero_at_step_one_is_a_reference_mismatch_and_names_dropout(tmp_path):
    def off(step):
        return dict(healthy(step), ref_c=0.3, ref_r=-0.2)
    f = found(preference_run(tmp_path / "m", off, overrides=["model.dropout=0.1"]))["reference_mismatch"]
    assert "dropout" in f.causes[0] and f.confidence == "high" and f.steps == [1]
    assert "reference_mismatch" not in found(preference_run(tmp_path / "m2", healthy))


def test_the_chosen_log_prob_falling_in_the_first_log_interval_is_read_from_the_rewards(tmp_path):
    """A fall before the first logged window (logps/chosen already low at the first records, flat after) is seen in
    rewards/chosen / β, the log-ratio to the policy's start; the rejected ones are measured from the start too."""
    def fast(step):
        k = min(1.0, step / 10)
        return dict(healthy(step), **{"logps/chosen": -120.0 - 70 * k, "logps/rejected": -125.0 - 130 * k,
                                      "rewards/chosen": -7.0 * k, "rewards/rejected": -13.0 * k,
                                      "rewards/margins": 6.0 * k, "rewards/accuracies": 0.9})
    f = found(preference_run(tmp_path / "f", fast, log_interval=10, steps=200))["likelihood_displacement"]
    assert any("below the policy's start" in e and "-70 nats" in e for e in f.evidence)
    assert any("fell faster" in e for e in f.evidence) and f.confidence == "high"


def test_a_preference_loss_is_not_judged_on_cross_entropy_levels(tmp_path):
    """DPO's loss near 0 (pairs separated) and IPO's at 1/(2β)² = 25 are healthy; read as cross-entropy they would be
    'loss too low to be real', 'above ln(vocab)' or 'stuck'."""
    def separated(step):
        return dict(healthy(step), loss=0.693 * 0.97 ** step + 0.01)
    def ipo(step):
        return dict(healthy(step), loss=25.0 - 0.002 * step)
    cross_entropy = {"labels", "bad_start", "divergence", "loss_not_falling", "loss_plateau", "slow_progress",
                     "underfitting"}
    assert not cross_entropy & set(found(preference_run(tmp_path / "dpo", separated)))
    assert not cross_entropy & set(found(preference_run(tmp_path / "ipo", ipo,
                                                        overrides=["finetune.preference.loss=ipo"])))

"""The published configurations `ms-llm diagnose` judges settings against (ms_llm/diagnose/priors/) and the table of
how each key of the schema is judged (priors/keys.yaml): every key is judged or says why not, every value has a
source, and configs that follow the published ones raise nothing."""
import dataclasses
import glob
import json
import os
import typing

import pytest

from conftest import ROOT
from ms_llm.config import load_config, save_config
from ms_llm.config.schema import Config
from ms_llm.diagnose import priors
from ms_llm.diagnose.rules import published
from ms_llm.rundir.reader import load_run

RECIPE_KEYS = ("derived.batch_tokens", "derived.train_tokens", "derived.warmup_share", "derived.min_lr_share")


def schema_keys(cls=Config, prefix=""):
    """Every dotted key of a config class, nested optional sections (model.moe, train.anomaly, ...) included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = [a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if dataclasses.is_dataclass(a)]
        if inner:
            yield from schema_keys(inner[0], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def unjudged(cls=Config):
    """The schema keys keys.yaml says nothing about (neither judged nor declared unjudgeable with a reason)."""
    table = priors.keys()
    return [k for k in schema_keys(cls) if k not in table or (table[k]["how"] == "unjudged"
                                                                and not str(table[k].get("why", "")).strip())]


def test_every_key_of_the_schema_is_judged_or_says_why_not():
    assert unjudged() == []
    table = priors.keys()
    keys = set(schema_keys())
    stale = [k for k in table if k not in keys and k not in priors.DERIVED]
    assert stale == [], f"keys.yaml judges keys the schema no longer has: {stale}"
    for key, spec in table.items():
        if spec["how"] == "through":
            targets = spec.get("why") if isinstance(spec.get("why"), list) else None
            assert targets and all(t in priors.DERIVED and t in table for t in targets), (key, spec)
        if spec["how"] == "rule":
            path = str(spec["why"]).split(" ", 1)[0].rstrip(":")
            assert os.path.isfile(os.path.join(ROOT, "ms_llm", "diagnose", path)), (key, path)
    assert all(d in table for d in priors.DERIVED), "a derived quantity keys.yaml does not judge"


def test_a_key_added_without_a_prior_or_a_reason_fails_the_walk():
    @dataclasses.dataclass(frozen=True)
    class Planted:
        shrink_factor: float = 0.5

    planted = dataclasses.make_dataclass("PlantedConfig", [("planted", Planted, dataclasses.field(
        default_factory=Planted))], bases=(Config,), frozen=True)
    assert unjudged(planted) == ["planted.shrink_factor"]


def test_how_many_keys_are_judged_and_why_the_others_are_not():
    table = priors.keys()
    keys = list(schema_keys())
    by_how = {}
    for k in keys:
        by_how.setdefault(table[k]["how"], []).append(k)
    judged = len(keys) - len(by_how.get("unjudged", []))
    # the figures the closing note quotes: most keys are judged; the rest are paths, names and cadences
    assert judged >= 80 and len(priors.DERIVED) >= 10, {h: len(v) for h, v in by_how.items()}
    reasons = {table[k]["why"] for k in by_how["unjudged"]}
    assert "a path" in reasons


def test_every_published_value_has_a_source_and_a_key_of_the_schema():
    keys = set(schema_keys())
    assert len(priors.entries()) >= 100
    for e in priors.entries():
        assert e.source and e.values, e.name
        for k in e.values:
            assert k in keys or k in RECIPE_KEYS or k.startswith("hf."), (e.file, e.name, k)


def test_every_judged_range_has_published_values_to_judge_against():
    for key, spec in priors.keys().items():
        if spec["how"] == "range" and spec.get("reference") != "default":
            assert priors.published(key).numbers, f"{key}: no published value (keys.yaml judges it by range)"


def test_the_published_shapes_agree_on_their_derived_quantities():
    """What the released models agree on (the spans diagnose judges shapes against)."""
    lo, hi = priors.published("derived.head_dim").span()
    assert lo == 64 and hi == 128  # GPT-2, Llama 3.2 1B, Qwen2.5 0.5B: 64; Llama 2/3, Qwen3, Mistral: 128
    lo, hi = priors.published("derived.ffn_ratio").span()
    assert 2.6 < lo < 2.7 and 5 < hi < 6  # Llama 3.2 3B's 8192/3072 to Qwen2.5 1.5B's 8960/1536
    assert priors.published("derived.kv_share").span()[1] == 1.0  # multi-head attention: every head its own


# --- the judge on runs -----------------------------------------------------------------------------------

def run_with(tmp_path, name, config=None, sets=()):
    path = os.path.join(tmp_path, name)
    os.makedirs(path)
    save_config(load_config(config, list(sets)), os.path.join(path, "config.yaml"))
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 10, "loss": 3.0}) + "\n")
    with open(os.path.join(path, "run_info.json"), "w") as f:
        json.dump({"host": "vm", "final": {}}, f)
    return load_run(path)


QUICKSTART = os.path.join(ROOT, "configs", "shakespeare_char.yaml")


def test_heads_of_width_one_and_an_mlp_16_wide_are_suspects_whatever_listed_them(tmp_path):
    heads = published.suspects(run_with(tmp_path, "heads", QUICKSTART, ["model.num_heads=128"]))
    assert [s.id for s in heads] == ["head_dim"] and heads[0].strong
    assert heads[0].sets == ("model.num_heads=2", "model.num_kv_heads=2")  # width 64, the key/value share kept
    assert "cost" in heads[0].effects and "64x below" in heads[0].cause
    mlp = published.suspects(run_with(tmp_path, "mlp", QUICKSTART, ["model.ffn_hidden_size=16"]))
    assert [s.id for s in mlp] == ["ffn_ratio"] and mlp[0].effects == ("slow",)
    assert mlp[0].sets == ("model.ffn_hidden_size=512",)  # GPT-2's 4 x hidden: the run's own family first


@pytest.mark.parametrize("sets", [["train.beta1=0.3"], ["model.norm_eps=0.5"], ["model.init_std=0.0001"],
                                  ["model.arch=llama", "model.rope_theta=10"],
                                  ["precision.compute_dtype=float16", "precision.scale_window=5"]],
                         ids=lambda s: s[-1].split("=")[0])
def test_a_value_far_from_every_published_one_is_a_suspect_in_keys_nobody_listed(tmp_path, sets):
    key = sets[-1].split("=")[0]
    found = published.suspects(run_with(tmp_path, "r", QUICKSTART, sets))
    assert any(s.key == key for s in found), [(s.key, s.setting) for s in found]


CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
FAMILIES = {  # tiny models with each family's published ratios: head width 64, the family's MLP and KV share
    "gpt2": ["model.arch=gpt2", "model.hidden_size=256", "model.num_heads=4", "model.num_layers=4"],
    "llama2": ["model.arch=llama", "model.hidden_size=256", "model.num_heads=4", "model.num_layers=4",
               "model.ffn_hidden_size=688"],
    "llama3": ["model.arch=llama", "model.hidden_size=256", "model.num_heads=4", "model.num_kv_heads=1",
               "model.num_layers=4", "model.ffn_hidden_size=896", "model.rope_theta=500000"],
    "qwen2.5": ["model.arch=llama", "model.hidden_size=256", "model.num_heads=4", "model.num_kv_heads=1",
                "model.num_layers=4", "model.ffn_hidden_size=1408", "model.qkv_bias=true", "model.norm_eps=1e-6",
                "model.rope_theta=1000000"],
    "qwen3": ["model.arch=llama", "model.hidden_size=256", "model.num_heads=4", "model.num_kv_heads=2",
              "model.num_layers=4", "model.ffn_hidden_size=768", "model.qk_norm=true", "model.norm_eps=1e-6"],
    "mixtral": ["model.arch=llama", "model.hidden_size=256", "model.num_heads=4", "model.num_kv_heads=1",
                "model.num_layers=4", "model.ffn_hidden_size=896", "model.moe={num_experts: 8, top_k: 2}"],
}


@pytest.mark.parametrize("config", CONFIGS, ids=os.path.basename)
def test_the_configs_the_project_ships_have_no_suspect(tmp_path, config):
    from ms_llm.diagnose.rules.schedule import suspects

    assert [s.setting for s in suspects(run_with(tmp_path, "c", config))] == []


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tiny_model_with_a_familys_published_ratios_has_no_suspect(tmp_path, family):
    found = published.suspects(run_with(tmp_path, family, QUICKSTART, FAMILIES[family]))
    assert [s.setting for s in found] == []

"""Config files a user hands in, damaged: an ms_llm config YAML, a MindFormers YAML (`convert
--from-mindformers-config`) and a Hugging Face config.json (`convert --from-hf`): cut, bytes flipped, values of
the wrong type. Each reads or is one paragraph naming the file."""
import os

import yaml
from hypothesis import strategies as st

from fuzzing import ROOT, Property, as_test, damaged, json_text, lied, reads_or_refuses, write

CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.yaml")
MINDFORMERS = os.path.join(ROOT, "tests", "fixtures", "mindformers", "pretrain_llama2_7b.yaml")
HF_CONFIGS = [
    {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 16, "vocab_size": 50,
     "layer_norm_epsilon": 1e-5},
    {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
     "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 16, "vocab_size": 50,
     "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8}},
]


def raw(path):
    with open(path, "rb") as f:
        return f.read()


def yaml_files(path):
    """The YAML's bytes damaged, or its values lied about (written back as YAML)."""
    doc = yaml.safe_load(raw(path))
    return st.one_of(damaged(raw(path)), lied(doc).map(lambda d: yaml.safe_dump(d, sort_keys=False).encode()))


def read_config(folder, data):
    from ms_llm.config import load_config

    path = write(folder, "my_config.yaml", data)
    return reads_or_refuses(lambda: load_config(path), "my_config.yaml")


def read_mindformers(folder, data):
    from ms_llm.interop.mindformers.config import convert_config

    path = write(folder, "pretrain_llama.yaml", data)
    out = os.path.join(folder, "ours.yaml")
    return reads_or_refuses(lambda: convert_config(path, out, log=lambda *_: None), "pretrain_llama.yaml")


def read_hf_config(folder, data):
    from ms_llm.interop import huggingface

    write(folder, "config.json", data)
    return reads_or_refuses(lambda: huggingface.hf_model_section(folder), "config.json")


PROPERTIES = {
    "config YAML": Property(yaml_files(CONFIG), read_config),
    "MindFormers YAML": Property(yaml_files(MINDFORMERS), read_mindformers),
    "HF config.json": Property(st.one_of(*[st.one_of(lied(c).map(json_text), damaged(json_text(c)))
                                           for c in HF_CONFIGS]), read_hf_config),
}

test_config_yaml = as_test(PROPERTIES["config YAML"])
test_mindformers_yaml = as_test(PROPERTIES["MindFormers YAML"])
test_hf_config_json = as_test(PROPERTIES["HF config.json"])

"""Tokenizer files a user hands in, damaged: a Hugging Face tokenizer.json, the tokenizer_config.json beside it
(special tokens, its chat_template) and a chat_template.jinja. Each reads (and encodes, or renders a conversation)
or is one paragraph naming the file; a template that refuses a conversation is a TemplateProblem, which the
preprocessor names with the line of the data."""
import json
import os
import tempfile

from hypothesis import strategies as st

from fuzzing import Property, as_test, damaged, json_text, lied, reads_or_refuses, write
from ms_llm.data.templates import ChatTemplate, TemplateProblem, find_template
from ms_llm.data.tokenizers import build_tokenizer

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
            "{% else %}{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}{% endif %}{% endfor %}")
TOKENIZER_CONFIG = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "chat_template": TEMPLATE,
                    "model_max_length": 2048, "added_tokens_decoder": {"0": {"content": "<unk>", "special": True}}}
CONVERSATION = [{"role": "user", "content": "to be or not"}, {"role": "assistant", "content": "to be"}]


def tokenizer_json():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["to be or not to be"] * 10, trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    with tempfile.TemporaryDirectory() as d:
        t.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer.json"), "rb") as f:
            return f.read()


TOKENIZER = tokenizer_json()


def read_tokenizer(folder, data):
    path = write(folder, "tokenizer.json", data)
    return reads_or_refuses(lambda: build_tokenizer(path).encode("to be or not"), "tokenizer.json")


def render(tok_path, override=None):
    template = ChatTemplate.from_spec(find_template(tok_path, override))
    try:
        template.assistant_spans(CONVERSATION)
    except TemplateProblem:
        return "refused"


def read_tokenizer_config(folder, data):
    tok = write(folder, "tokenizer.json", TOKENIZER)
    write(folder, "tokenizer_config.json", data)
    return reads_or_refuses(lambda: (build_tokenizer(tok), render(tok)), "tokenizer_config.json")


def read_chat_template(folder, data):
    path = write(folder, "chat_template.jinja", data)
    return reads_or_refuses(lambda: render(None, path), "chat_template.jinja")


PROPERTIES = {
    "tokenizer.json": Property(st.one_of(damaged(TOKENIZER), lied(json.loads(TOKENIZER)).map(json_text)),
                               read_tokenizer),
    "tokenizer_config.json + chat template": Property(
        st.one_of(damaged(json_text(TOKENIZER_CONFIG)), lied(TOKENIZER_CONFIG).map(json_text)), read_tokenizer_config),
    "chat_template.jinja": Property(damaged(TEMPLATE.encode()), read_chat_template),
}

test_tokenizer_json = as_test(PROPERTIES["tokenizer.json"])
test_tokenizer_config_and_chat_template = as_test(PROPERTIES["tokenizer_config.json + chat template"])
test_chat_template_file = as_test(PROPERTIES["chat_template.jinja"])

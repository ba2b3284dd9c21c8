"""Fine-tuning data: chat templates rendered as transformers renders them, loss masks on the assistant's tokens only,
packing without splitting a conversation, the manifest and the reader's extra columns, bad input."""
import json
import os

import numpy as np
import pytest

from ms_llm.cli import main
from ms_llm.data.chat import BadRecord, encode_conversation, messages_of
from ms_llm.data.chat_pack import ConversationPacker
from ms_llm.data.templates import ChatTemplate, TemplateProblem, find_template, token_mask
from ms_llm.data.tokenizers import build_tokenizer
from ms_llm.errors import UserError

from finetune_fixtures import QUIET, assets, demo, write_jsonl

CONVERSATION = [{"role": "user", "content": "ROMEO: What light through yonder window breaks?"},
                {"role": "assistant", "content": "JULIET: It is the east."},
                {"role": "user", "content": "ROMEO: And Juliet is the sun."},
                {"role": "assistant", "content": "JULIET: Arise, fair sun."}]


@pytest.fixture(scope="module")
def chat():
    a = assets()
    tok = build_tokenizer(a["tok"])
    return a, tok, ChatTemplate.from_spec(find_template(a["tok"]))


def test_the_mask_of_one_conversation_covers_the_replies_and_nothing_else(chat):
    """The tokens the mask keeps are exactly each reply and its end-of-turn (`<|im_end|>\\n`): not the system
    message, the user's turns or the `<|im_start|>assistant\\n` header."""
    _, tok, template = chat
    ids, mask = encode_conversation(tok, template, CONVERSATION)
    kept = [tok.tok.decode([int(i)], skip_special_tokens=False) for i, m in zip(ids, mask) if m]
    assert "".join(kept) == ("JULIET: It is the east.<|im_end|>\nJULIET: Arise, fair sun.<|im_end|>\n")
    left_out = tok.tok.decode([int(i) for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert "ROMEO" in left_out and "Continue the scene." in left_out and "JULIET" not in left_out
    assert mask[0] == 0 and mask.dtype == np.uint8 and len(ids) == len(mask)


def test_generation_markers_and_rendered_prefixes_agree(chat):
    """A template with transformers' {% generation %} markers and the same template without them (assistant spans by
    rendering prefixes) render the same text and mask the same tokens, but for the newline after each end-of-turn,
    which only the prefixes include."""
    a, tok, plain = chat
    marked = ChatTemplate.from_spec(find_template(a["tok_marked"]))
    assert marked.markers and not plain.markers
    assert marked.render(CONVERSATION) == plain.render(CONVERSATION)
    ids_m, mask_m = encode_conversation(tok, marked, CONVERSATION)
    ids_p, mask_p = encode_conversation(tok, plain, CONVERSATION)
    assert list(ids_m) == list(ids_p)
    newline = tok.token_id("\u010a")  # byte-level "\n"
    differ = [i for i in range(len(ids_m)) if mask_m[i] != mask_p[i]]
    assert differ and all(ids_p[i] == newline and mask_p[i] == 1 for i in differ)


def test_token_mask_takes_every_token_that_overlaps_a_span():
    """transformers' rule: a token cut by a span's edge belongs to the assistant."""
    offsets = [(0, 3), (3, 5), (5, 9), (9, 10), (10, 14)]
    assert token_mask(offsets, [(4, 9)]) == [0, 1, 1, 0, 0]
    assert token_mask(offsets, [(0, 3), (9, 12)]) == [1, 0, 0, 1, 1]
    assert token_mask(offsets, []) == [0] * 5


def test_template_environment_is_transformers_one(tmp_path):
    """trim_blocks/lstrip_blocks, raise_exception with the template's message, tojson keeping non-ASCII, a
    namespace and loop controls: the features chat templates of released models rely on."""
    text = ("{% set ns = namespace(n=0) %}\n"
            "  {% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
            "{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content | tojson }};"
            "{% endfor %}\n{{ ns.n }}")
    t = ChatTemplate(text)
    msgs = [{"role": "user", "content": "été"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert t.render(msgs) == '"été";"b";2'
    with pytest.raises(TemplateProblem, match="no tools here"):
        t.render([{"role": "tool", "content": "x"}])


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_way_out(chat):
    """Assistant spans by prefixes need each prefix to render as the start of the whole; a template that drops past
    reasoning does not, and is refused naming {% generation %}."""
    _, tok, _ = chat
    rewrites = ChatTemplate("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
                            "{{ m.content.split('|')[-1] }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "think|a"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(BadRecord, match="generation"):
        encode_conversation(tok, rewrites, msgs)


@pytest.mark.parametrize("record, fmt, why", [
    ({"messages": [{"content": "x"}]}, "chat", "message 1 has no string 'role'"),
    ({"messages": [{"role": "user"}]}, "chat", r"message 1 \(user\) has no string 'content'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "chat", "no assistant message"),
    ({"text": "x"}, "chat", "no 'messages' list"),
    ({"prompt": "x"}, "instruction", "no string field 'response'"),
    ({"prompt": "x", "response": "y", "system": 3}, "instruction", "'system' field that is not a string"),
])
def test_records_missing_a_role_or_field_are_named(record, fmt, why):
    with pytest.raises(BadRecord, match=why):
        messages_of(record, fmt)


def test_instruction_records_are_user_and_assistant_turns():
    assert messages_of({"prompt": "p", "response": "r", "system": "s"}, "instruction") == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "p"}, {"role": "assistant", "content": "r"}]


def test_packing_keeps_conversations_whole_and_numbers_them():
    p = ConversationPacker(10, pad_id=99)
    a, b, c = (np.arange(n, dtype=np.int32) + 10 * k for k, n in enumerate((4, 5, 7), 1))
    out = [p.add(x, np.ones(len(x), np.uint8)) for x in (a, b, c)] + [p.close()]
    samples = np.concatenate(out)
    assert samples.shape == (2, 3, 10)
    ids, mask, seg = samples[0]
    assert list(ids) == list(a) + list(b) + [99] and list(seg) == [1] * 4 + [2] * 5 + [0]
    assert list(mask) == [1] * 9 + [0]
    assert list(samples[1, 2]) == [1] * 7 + [0] * 3  # c did not fit: a new sample, padded
    assert p.stats() == {"conversations": 3, "samples": 2, "tokens": 16, "loss_tokens": 16, "fill_rate": 0.8,
                         "loss_fraction": 1.0}
    single = ConversationPacker(10, 99, pack=False)
    got = np.concatenate([single.add(x, np.ones(len(x), np.uint8)) for x in (a, b)] + [single.close()])
    assert got.shape == (2, 3, 10) and set(got[:, 2].ravel()) == {0, 1}  # one conversation per sample


def test_preprocess_chat_writes_mask_and_segments_the_reader_returns(chat, tmp_path):
    """The MindRecord holds the three columns, the manifest says how the data was made, and the reader's batches
    carry the mask and segment ids next to the ids; the masked tokens of each sample are its conversations' replies."""
    from ms_llm.data.chat_preprocess import preprocess_conversations
    from ms_llm.data.loader import Batch, TrainBatches
    from ms_llm.data.manifest import load_manifest

    a, tok, _ = chat
    m = preprocess_conversations(a["chat"], str(tmp_path / "d"), 319, a["tok"], "chat", 0.1, workers=1, **QUIET)
    assert m["columns"] == ["input_ids", "loss_mask", "segment_ids"] and m["packed"] and m["format"] == "chat"
    ft = m["finetune"]
    assert ft["train"]["conversations"] + ft["val"]["conversations"] == 120 and ft["truncated"] == 0
    assert 0.2 < ft["train"]["loss_fraction"] < 0.6 and ft["train"]["samples"] < ft["train"]["conversations"]
    assert "<|im_start|>" in m["chat_template"]["text"] and m["pad_id"] == tok.token_id("<|endoftext|>")
    # the splits' overlap is measured on the reply tokens alone, one stream per split (the shared template text
    # would read as copied); `data info` then shows it instead of rebuilding it from the padded rows
    k = m["overlap"]["shingle_tokens"]
    assert m["overlap"]["train_shingles"] == ft["train"]["loss_tokens"] - k + 1
    assert m["overlap"]["val_shingles"] == ft["val"]["loss_tokens"] - k + 1
    batch = next(TrainBatches(str(tmp_path / "d"), load_manifest(str(tmp_path / "d")), "train", 4, shuffle=False))
    assert isinstance(batch, Batch) and batch.ids.shape == batch.loss_mask.shape == batch.segments.shape == (4, 320)
    ids, mask, seg = batch.ids.asnumpy()[0], batch.loss_mask.asnumpy()[0], batch.segments.asnumpy()[0]
    assert seg.max() >= 2  # packed
    replies = tok.tok.decode([int(i) for i, k in zip(ids, mask) if k], skip_special_tokens=False)
    assert replies.count("<|im_end|>") == replies.count("\n") >= 2 and "Continue the scene" not in replies
    assert (mask[seg == 0] == 0).all() and (ids[seg == 0] == m["pad_id"]).all()


def test_no_pack_long_conversations_cut_or_refused_and_data_info(chat, tmp_path, capsys):
    """--no-pack: one conversation per sample; a conversation longer than a sample is cut (counted) or, with
    --refuse-long, stops preprocessing naming its line; `data info` shows the fill rate and the cuts."""
    a, _, _ = chat
    args = ["preprocess", "--format", "chat", "--input", a["chat"], "--tokenizer", a["tok"], "--workers", "1"]
    assert main(args + ["--seq-length", "127", "--output-dir", str(tmp_path / "np"), "--no-pack"]) == 0
    m = json.load(open(tmp_path / "np" / "manifest.json"))
    assert not m["packed"] and m["finetune"]["train"]["samples"] == m["finetune"]["train"]["conversations"]
    assert m["finetune"]["truncated"] > 0  # two-exchange conversations exceed 128 tokens
    assert main(["data", "info", str(tmp_path / "np")]) == 0
    out = capsys.readouterr().out
    assert "one conversation per sample" in out and "fill rate" in out and "longer than a sample and cut" in out
    assert "overlap:" in out  # measured while preprocessing
    del m["overlap"]  # a chat dataset made before it was: its padded rows are not one stream, so nothing is measured
    json.dump(m, open(tmp_path / "np" / "manifest.json", "w"))
    assert main(["data", "info", str(tmp_path / "np")]) == 0
    assert "overlap:" not in capsys.readouterr().out
    assert "overlap" not in json.load(open(tmp_path / "np" / "manifest.json"))
    assert main(args + ["--seq-length", "127", "--output-dir", str(tmp_path / "r"), "--refuse-long"]) == 2
    err = capsys.readouterr().err
    assert "chat.jsonl' line" in err and "longer than a sample" in err and not (tmp_path / "r").exists()


def test_bad_lines_stop_or_are_skipped_and_instruction_format(chat, tmp_path, capsys):
    a, _, _ = chat
    recs = [json.loads(x) for x in open(a["chat"])][:40]
    src = write_jsonl(tmp_path / "bad.jsonl", recs[:10] + [{"messages": [{"content": "no role"}]}] + recs[10:])
    args = ["preprocess", "--format", "chat", "--tokenizer", a["tok"], "--seq-length", "255", "--workers", "1"]
    assert main(args + ["--input", src, "--output-dir", str(tmp_path / "o")]) == 2
    assert "bad.jsonl' line 11 message 1 has no string 'role'" in capsys.readouterr().err
    assert main(args + ["--input", src, "--output-dir", str(tmp_path / "o"), "--skip-bad"]) == 0
    assert json.load(open(tmp_path / "o" / "manifest.json"))["bad_lines"] == 1
    inst = ["preprocess", "--format", "instruction", "--input", a["instruction"], "--tokenizer", a["tok"],
            "--seq-length", "255", "--output-dir", str(tmp_path / "i"), "--workers", "1"]
    assert main(inst) == 0
    assert json.load(open(tmp_path / "i" / "manifest.json"))["format"] == "instruction"


def test_no_chat_template_is_one_paragraph_and_exit_2(chat, tmp_path, capsys):
    a, _, _ = chat
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_text(open(a["tok"]).read())  # no tokenizer_config.json beside it
    base = ["preprocess", "--format", "chat", "--input", a["chat"], "--seq-length", "255", "--output-dir",
            str(tmp_path / "o")]
    assert main(base + ["--tokenizer", str(bare / "tokenizer.json")]) == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and "--chat-template" in err and "Traceback" not in err
    assert main(base + ["--tokenizer", "char"]) == 2
    assert "char tokenizer" in capsys.readouterr().err
    template = tmp_path / "t.jinja"
    template.write_text(demo.CHATML)
    assert main(base + ["--tokenizer", str(bare / "tokenizer.json"), "--chat-template", str(template),
                        "--workers", "1"]) == 0
    assert not (tmp_path / "o" / ".tmp").exists() and os.path.isfile(tmp_path / "o" / "manifest.json")
    with pytest.raises(UserError, match="apply to --format chat or instruction only"):
        from ms_llm.cli import cmd_preprocess, build_parser
        cmd_preprocess(build_parser().parse_args(["preprocess", "--input", a["chat"], "--seq-length", "8",
                                                  "--output-dir", str(tmp_path / "x"), "--no-pack"]))


def test_sample_chat_prompt_is_the_training_rendering_up_to_the_reply(chat):
    """`sample --chat` renders the prompt with the template the data was made with (the manifest's): its ids are the
    training conversation's ids up to the first token the mask keeps, and it stops at the template's eos_token. A
    dataset without a template is refused in one paragraph."""
    from ms_llm.train.generate import chat_prompt

    _, tok, template = chat
    ids, mask = encode_conversation(tok, template, CONVERSATION[:2])
    first_reply = int(np.argmax(mask))
    prompt_ids, stop = chat_prompt({"chat_template": template.spec()}, tok, CONVERSATION[0]["content"], "R")
    assert list(prompt_ids) == list(ids[:first_reply])
    assert stop == tok.token_id("<|im_end|>")
    with pytest.raises(UserError, match="no chat template"):
        chat_prompt({}, tok, "hi", "R")


def test_a_full_disk_while_writing_chat_data_is_the_disk_full_paragraph(chat, tmp_path, monkeypatch, capsys):
    """MindRecord reports a full disk as a RuntimeError: the chat pipeline explains it as plain-text preprocessing
    does (one paragraph, exit 2), and the dataset already in the output folder is kept."""
    from ms_llm.data.shards import ShardWriter

    a, _, _ = chat
    out = tmp_path / "d"
    out.mkdir()
    (out / "manifest.json").write_text("{}")

    def full_disk(self, samples):
        raise RuntimeError("[ERROR] No free disk to be used while writing mindrecord files, available free disk "
                           "size: 0")

    monkeypatch.setattr(ShardWriter, "write", full_disk)
    code = main(["preprocess", "--format", "chat", "--input", a["chat"], "--tokenizer", a["tok"], "--seq-length", "255",
                 "--output-dir", str(out), "--workers", "1", "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "the disk is full" in err and "the partial dataset was removed" in err, err
    assert "Traceback" not in err and (out / "manifest.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary folder left


@pytest.mark.slow  # starts tokenizing workers
def test_a_killed_worker_while_preprocessing_chat_is_named_and_nothing_is_replaced(chat, tmp_path, monkeypatch,
                                                                                     capsys):
    """The out-of-memory killer takes a tokenizing worker mid-run: the chat pipeline ends with the workers' paragraph
    (which worker, its signal) plus the promise plain text makes: the old dataset is still there."""
    import multiprocessing
    import signal

    import ms_llm.data.chat_preprocess as C
    import ms_llm.data.sources as sources
    from ms_llm.data.shards import ShardWriter

    a, _, _ = chat
    monkeypatch.setattr(C, "SMALL_INPUT", 0)  # workers even for a small input
    monkeypatch.setattr(sources, "BLOCK", 4096)  # many chunks: the victim still has work when it is killed
    src = write_jsonl(tmp_path / "c.jsonl", [json.loads(x) for x in open(a["chat"])] * 20)
    out = tmp_path / "d"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    killed, real_write = [], ShardWriter.write

    def kill_a_worker_first(self, samples):
        if not killed:
            victim = multiprocessing.active_children()[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)
        return real_write(self, samples)

    monkeypatch.setattr(ShardWriter, "write", kill_a_worker_first)
    code = main(["preprocess", "--format", "chat", "--input", src, "--tokenizer", a["tok"], "--seq-length", "255",
                 "--output-dir", str(out), "--workers", "2", "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and killed and f"(pid {killed[0]}) was killed by SIGKILL" in err, err
    assert "any existing" in err and "Traceback" not in err and (out / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "d"]  # no temporary folder left

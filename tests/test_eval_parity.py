"""`ms-llm eval --hf DIR` against lm-eval's own Hugging Face model (`lm_eval --model hf --model_args pretrained=DIR`)
on one random transformers model (Qwen2 layout, float32) and the same local task files: a multiple-choice task, a
perplexity (loglikelihood_rolling) task and a generate_until task, offline (`dataset_path: json`, local data_files).
acc and acc_norm must be identical, perplexities within 1e-4 relative, every generated text the same. The
tokenizer adds a BOS token (a TemplateProcessing post-processor), as Llama's does, so the special-token rules are
exercised; some requests are longer than the model's 64 positions, so the left cut is too. Also here: the KV-cache
generation against transformers' generate on the same converted model, and the bad-input paragraphs that need the
real task index."""
import contextlib
import io
import json

import numpy as np
import pytest

from conftest import SHAKESPEARE

pytestmark = pytest.mark.slow
CONTEXT = 64
TASKS = "local_mc,local_ppl,local_gen"


def tokenizer_files(folder):
    """A byte-level BPE of 300 tokens with <|endoftext|> (eos) and <s> (bos, added in front of every encoding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()[:100000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text[i:i + 1000] for i in range(0, len(text), 1000)],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False}))
    return tok.get_vocab_size()


def write_tasks(folder):
    """Three local tasks from the bundled text; some contexts longer than the model's positions."""
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    rng = np.random.default_rng(0)
    lines = [line for line in text[200000:400000].split("\n") if len(line) > 20]
    mc = []
    for i in range(40):
        line = lines[rng.integers(len(lines))]
        cut = len(line) // 2
        context = (" ".join(lines[i * 7:i * 7 + 6]) + " " if i % 5 == 0 else "") + line[:cut]  # a fifth too long
        distractors = [lines[rng.integers(len(lines))][:len(line) - cut] for _ in range(3)]
        label = int(rng.integers(4))
        mc.append({"q": context, "choices": distractors[:label] + [line[cut:]] + distractors[label:], "label": label})
    docs = [{"text": text[400000 + i * 700:400000 + i * 700 + int(rng.integers(100, 700))]} for i in range(12)]
    gen = [{"prompt": (" ".join(lines[500 + i:503 + i]) + " " if i % 4 == 0 else "") + lines[i][:30],
            "answer": lines[i][30:]} for i in range(20)]
    for name, rows in (("mc", mc), ("ppl", docs), ("gen", gen)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n"
    (folder / "mc.yaml").write_text("task: local_mc\n" + head.format(folder / "mc.jsonl") + (
        "output_type: multiple_choice\ndoc_to_text: \"{{q}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"))
    (folder / "ppl.yaml").write_text("task: local_ppl\n" + head.format(folder / "ppl.jsonl") + (
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"))
    (folder / "gen.yaml").write_text("task: local_gen\n" + head.format(folder / "gen.jsonl") + (
        "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \".\"]\n  max_gen_toks: 16\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """{hf: a random Qwen2-layout transformers model with its tokenizer, tasks: the three task YAMLs}. Torch runs on
    one thread while the module's tests run (as MindSpore does under xdist): two threads of a tiny model's forward
    spin more than they compute (lm-eval's pass over the tasks: 2.5 CPU seconds on one thread, 7.7 on two)."""
    import torch
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval_parity")
    hf, tasks = root / "hf", root / "tasks"
    hf.mkdir()
    tasks.mkdir()
    vocab = tokenizer_files(hf)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=CONTEXT,
                                      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # weights large enough that choices and next tokens are far from ties
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p))
    model.save_pretrained(str(hf))
    write_tasks(tasks)
    yield {"root": root, "hf": hf, "tasks": tasks, "model": model}
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def theirs(folder):
    """lm-eval's hf model on the folder (what `lm_eval --model hf --model_args pretrained=DIR,dtype=float32` runs;
    in-process, with the index of the local tasks only)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder['hf']},dtype=float32", device="cpu",
                                   tasks=TASKS.split(","), bootstrap_iters=0, log_samples=True,
                                   task_manager=TaskManager(include_path=str(folder["tasks"]), include_defaults=False))


@pytest.fixture(scope="module")
def ours(folder):
    """`ms-llm eval --hf DIR` as a user runs it, through the CLI's main in this process (a process of its own would
    import MindSpore, lm-eval and transformers again): (results JSON, its stdout)."""
    from ms_llm.cli import main

    out, stdout, stderr = folder["root"] / "ours.json", io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["eval", "--hf", str(folder["hf"]), "--tasks", TASKS, "--include-path", str(folder["tasks"]),
                     "--output", str(out), "--log-samples", "--bootstrap-iters", "0"])
    assert code == 0, stdout.getvalue()[-2000:] + stderr.getvalue()[-3000:]
    return json.loads(out.read_text()), stdout.getvalue()


def test_multiple_choice_accuracy_is_identical(theirs, ours):
    for metric in ("acc,none", "acc_norm,none"):
        assert ours[0]["results"]["local_mc"][metric] == theirs["results"]["local_mc"][metric], metric
    a = [s["filtered_resps"] for s in sorted(theirs["samples"]["local_mc"], key=lambda s: s["doc_id"])]
    b = [s["filtered_resps"] for s in sorted(ours[0]["samples"]["local_mc"], key=lambda s: s["doc_id"])]
    assert np.allclose(np.array(b, dtype=float)[..., 0], np.array(a, dtype=float)[..., 0], rtol=1e-5, atol=1e-4)


def test_perplexities_agree_within_1e_4(theirs, ours):
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        a, b = theirs["results"]["local_ppl"][metric], ours[0]["results"]["local_ppl"][metric]
        assert abs(b - a) <= 1e-4 * abs(a), (metric, a, b)


def test_generated_texts_are_identical(theirs, ours):
    a = {s["doc_id"]: s["filtered_resps"] for s in theirs["samples"]["local_gen"]}
    b = {s["doc_id"]: s["filtered_resps"] for s in ours[0]["samples"]["local_gen"]}
    assert a == b
    assert ours[0]["results"]["local_gen"]["exact_match,none"] == theirs["results"]["local_gen"]["exact_match,none"]


def test_requests_longer_than_the_context_are_cut_and_said_once(ours):
    results, stdout = ours
    assert results["ms_llm"]["truncated_requests"] > 0 and results["ms_llm"]["context"] == CONTEXT
    assert stdout.count("longer than the model's context") == 1, stdout[-3000:]


def test_kv_cache_greedy_tokens_are_transformers_generate_ones(folder):
    """Our Generator (prefill + one token per step, a batch of prompts of different lengths) and transformers'
    generate (greedy, one prompt at a time) on the same weights."""
    import torch

    from ms_llm.eval.source import load_model
    from ms_llm.generate import Generator

    loaded = load_model(hf=str(folder["hf"]), log=lambda *a: None)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(2, 300, n).tolist() for n in (5, 20, 40)]
    eos = loaded.tokenizer.eot_id
    got = Generator(loaded.model, loaded.context, batch_size=4).generate(  # greedy: the argmax in the graph
        prompts, 20, None, lambda _, tokens: tokens[-1] == eos)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = folder["model"].generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        assert tokens == out[0, len(prompt):].tolist(), f"prompt of {len(prompt)} tokens"


def test_an_unknown_task_is_one_paragraph_naming_the_close_names(folder, capsys):
    """Not among the include path's tasks: lm-eval's own ~15,000 are indexed, and it is not there either."""
    from ms_llm.cli import main

    assert main(["eval", "--hf", str(folder["hf"]), "--tasks", "local_mcq", "--include-path", str(folder["tasks"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown task 'local_mcq' (did you mean local_mc?)" in err[0] and "--include-path" in err[0]


def test_lm_eval_builds_the_ms_llm_model_from_its_model_args(folder, ours):
    """`simple_evaluate(model="ms_llm", model_args="hf=DIR")`: the registered name, as lm-eval builds models."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import ms_llm.eval.harness  # noqa: F401  (registers ms_llm)

    out = lm_eval.simple_evaluate(model="ms_llm", model_args=f"hf={folder['hf']},batch_size=4", device="cpu",
                                  tasks=["local_mc"], limit=8, bootstrap_iters=0,
                                  task_manager=TaskManager(include_path=str(folder["tasks"]), include_defaults=False))
    first = [s["acc"] for s in ours[0]["samples"]["local_mc"] if s["doc_id"] < 8]
    assert out["config"]["model"] == "ms_llm" and out["results"]["local_mc"]["acc,none"] == sum(first) / 8

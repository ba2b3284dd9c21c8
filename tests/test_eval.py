"""ms_llm/eval without a model run: the demo task, the bad-input paragraphs of `ms-llm eval`, the task index checks,
the tokenizer rules, and what the run-directory tools make of task records (reader, wall time, compare-curves,
report, diagnose's task_at_chance, config validation). The numbers against lm-eval's hf model:
test_eval_parity.py; evaluation during training: test_eval_training.py."""
import json
import os

import pytest

from conftest import ROOT, SHAKESPEARE
from ms_llm.cli import main
from ms_llm.config import load_config
from ms_llm.errors import UserError
from test_diagnose import healthy, write_run


@pytest.fixture(scope="module")
def lm_eval():
    """lm-eval imported once (about 2 s, pandas and datasets)."""
    import lm_eval.tasks  # noqa: F401

    return lm_eval


def paragraph(capsys, argv):
    """(exit code, the one stderr line) of `ms-llm` in-process."""
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return code, err[0]


def local_task(folder, name="tiny_mc", data=None):
    """A multiple-choice task YAML with dataset_path: json (its data file written unless `data` names one)."""
    folder.mkdir(exist_ok=True)
    if data is None:
        data = folder / f"{name}.jsonl"
        data.write_text(json.dumps({"q": "To be or not to", "choices": [" be", " go"], "label": 0}) + "\n")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{q}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\n")
    return folder


# --- the demo task -------------------------------------------------------------------------------------------

def test_the_demo_task_is_a_cloze_of_the_held_out_text():
    from ms_llm.eval import demo_task

    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    rows = demo_task.questions(text)
    tail = text[int(len(text) * 0.9):]
    assert len(rows) == demo_task.QUESTIONS and rows == demo_task.questions(text)  # deterministic
    for r in rows:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4
        assert len(r["context"]) == 48 and all(len(c) == 16 for c in r["choices"])
        assert r["context"] + r["choices"][r["label"]] in tail  # the true continuation, from the held-out tail
    assert {r["label"] for r in rows} == {0, 1, 2, 3}


def test_the_demo_task_files_are_written_once_for_lm_eval(tmp_path, lm_eval):
    from lm_eval.tasks import TaskManager

    from ms_llm.eval import demo_task

    folder = demo_task.write_task(folder=str(tmp_path / "demo"))
    before = os.path.getmtime(os.path.join(folder, "shakespeare_cloze.jsonl"))
    assert demo_task.write_task(folder=folder) == folder
    assert os.path.getmtime(os.path.join(folder, "shakespeare_cloze.jsonl")) == before  # unchanged: not rewritten
    manager = TaskManager(include_path=folder, include_defaults=False)
    assert manager.all_tasks == ["shakespeare_cloze"]
    cfg = manager.task_index["shakespeare_cloze"].cfg
    assert cfg["dataset_kwargs"]["data_files"]["test"] == os.path.join(folder, "shakespeare_cloze.jsonl")
    with pytest.raises(UserError, match="tinyshakespeare.txt"):
        demo_task.write_task(source=str(tmp_path / "missing.txt"), folder=str(tmp_path / "x"))


# --- bad input: one paragraph, exit 2 ---------------------------------------------------------------------------

@pytest.mark.parametrize("limit", ["0", "-3", "2.5"])
def test_a_limit_that_evaluates_nothing_is_refused(capsys, limit, lm_eval):
    code, err = paragraph(capsys, ["eval", "--hf", "x", "--tasks", "shakespeare_cloze", "--limit", limit])
    assert code == 2 and f"--limit = {float(limit)}" in err and "documents" in err


def test_a_task_whose_data_files_are_missing_is_refused(tmp_path, capsys, lm_eval):
    tasks = local_task(tmp_path / "tasks", data=tmp_path / "nowhere" / "mc.jsonl")
    code, err = paragraph(capsys, ["eval", "--hf", "x", "--tasks", "tiny_mc", "--include-path", str(tasks)])
    assert code == 2
    assert "task 'tiny_mc'" in err and str(tmp_path / "nowhere" / "mc.jsonl") in err and "data_files" in err


def test_an_include_path_that_is_not_a_folder_is_refused(tmp_path, capsys, lm_eval):
    code, err = paragraph(capsys, ["eval", "--hf", "x", "--tasks", "a", "--include-path", str(tmp_path / "no")])
    assert code == 2 and "--include-path" in err and "not a folder" in err


def test_a_run_without_a_tokenizer_is_refused(tmp_path, capsys, lm_eval):
    """The tokenizer comes from the run's dataset manifest: a run whose dataset is gone has none to give lm-eval."""
    run = tmp_path / "run"
    write_run(str(run), healthy(200), overrides=[f"data.dataset_dir={tmp_path / 'gone'}"], unigram=None)
    tasks = local_task(tmp_path / "tasks")
    code, err = paragraph(capsys, ["eval", "--run-dir", str(run), "--tasks", "tiny_mc", "--include-path", str(tasks)])
    assert code == 2 and "no tokenizer" in err and "--tokenizer" in err and str(tmp_path / "gone") in err


def test_unknown_task_names_are_found_before_any_model_loads(tmp_path, lm_eval):
    """The check itself on lm-eval's own index of the local tasks (the CLI's path through lm-eval's 15,000 tasks is in
    test_eval_parity.py)."""
    from lm_eval.tasks import TaskManager

    from ms_llm.eval.tasks import unknown, unknown_message

    tasks = local_task(tmp_path / "tasks", "local_mc")
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    assert unknown(manager, ["local_mc", "local_*", "local_mcq"]) == ["local_mcq"]
    message = unknown_message(["local_mcq"], manager, [str(tasks)])
    assert "unknown task 'local_mcq' (did you mean local_mc?)" in message and str(tasks) in message


def test_the_model_source_must_be_one(capsys, lm_eval):
    code, err = paragraph(capsys, ["eval", "--tasks", "shakespeare_cloze"])
    assert code == 2 and "--run-dir" in err and "--hf" in err


def test_the_default_batch_keeps_its_logits_within_a_gib(lm_eval):
    from types import SimpleNamespace

    from ms_llm.eval.harness import default_batch_size

    def rows(context, vocab):
        return default_batch_size(SimpleNamespace(context=context, model=SimpleNamespace(vocab_size=vocab)))

    assert rows(64, 66) == 32 and rows(2048, 151936) == 1 and rows(4096, 32000) == 2


# --- the tokenizer as lm-eval's hf model uses it -----------------------------------------------------------------

def test_a_char_tokenizer_has_no_special_tokens_and_says_which_text_it_cannot_encode():
    from ms_llm.data.tokenizers import CharTokenizer
    from ms_llm.eval.tokenizer import EvalTokenizer

    tok = EvalTokenizer(CharTokenizer(" abc"), source="run R")
    assert tok.encode("ab c") == [1, 2, 0, 3] and tok.prefix_id == tok.eot_id == 4
    assert tok.decode([1, 2, 4, 0, 3]) == "ab c"  # the end-of-document id decodes to nothing (a special token)
    with pytest.raises(UserError, match="run R.*'Z'.*shakespeare_cloze"):
        tok.encode("abZ")


# --- task records in the run-directory tools ---------------------------------------------------------------

def task_records(accs, steps=(0, 500, 1000, 1500, 2000), chance=0.25, docs=500):
    return [{"step": s, "tasks": ["cloze"], "cloze/acc": a, "cloze/acc_norm": a, "cloze/chance": chance,
             "cloze/docs": docs, "duration_s": 5.0} for s, a in zip(steps, accs)]


def test_task_records_are_read_and_accounted_as_task_evaluation(tmp_path):
    from ms_llm.rundir.reader import load_run
    from ms_llm.rundir.walltime import account

    path = write_run(str(tmp_path / "run"), healthy() + task_records([0.25, 0.4, 0.5, 0.55, 0.57]))
    run = load_run(path)
    assert len(run.task_evals) == 5 and not any("tasks" in r for r in run.train + run.evals + run.events)
    assert account(run)["phases"]["task evaluation"] == pytest.approx(25.0)


def test_compare_curves_gates_on_a_task_metric(tmp_path, capsys):
    a = write_run(str(tmp_path / "a"), healthy() + task_records([0.25, 0.4, 0.5, 0.55, 0.57]))
    b = write_run(str(tmp_path / "b"), healthy() + task_records([0.25, 0.4, 0.5, 0.55, 0.40]))
    assert main(["compare-curves", a, a, "--metric", "cloze/acc"]) == 0
    assert main(["compare-curves", a, b, "--metric", "cloze/acc"]) == 1
    assert "step 2000" in capsys.readouterr().out


def test_the_report_draws_a_task_panel_with_its_chance_level(tmp_path):
    from ms_llm.pages.runs import load_runs
    from ms_llm.pages.payload import Builder

    path = write_run(str(tmp_path / "run"), healthy() + task_records([0.25, 0.4, 0.5, 0.55, 0.57]))
    panels = {p["id"]: p for p in Builder(load_runs([path]), "step").build()}
    p = panels["task_cloze"]
    assert p["hlines"] == [0.25] and {s["label"] for s in p["series"]} == {"acc", "acc_norm"}
    assert p["series"][0]["y"] == [0.25, 0.4, 0.5, 0.55, 0.57]


def test_diagnose_says_when_validation_falls_and_a_task_stays_at_chance(tmp_path):
    from ms_llm.diagnose.engine import diagnose

    stuck = write_run(str(tmp_path / "stuck"), healthy() + task_records([0.25, 0.24, 0.27, 0.26, 0.25]))
    found = {f.id: f for f in diagnose(stuck)[1]}
    f = found["task_at_chance_cloze"]
    assert f.severity == "warning" and "chance" in f.symptom and "--log-samples" in " ".join(f.actions)
    learning = write_run(str(tmp_path / "learning"), healthy() + task_records([0.25, 0.4, 0.5, 0.55, 0.57]))
    assert not any(f.id.startswith("task_at_chance") for f in diagnose(learning)[1])
    few_docs = write_run(str(tmp_path / "few"), healthy() + task_records([0.25, 0.3, 0.35, 0.2, 0.3], docs=40))
    assert "task_at_chance_cloze" in {f.id for f in diagnose(few_docs)[1]}  # 40 documents: ±0.14 is luck


# --- the eval: section ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("sets, field", [
    (["eval.interval=300"], "eval.interval = 300 is not a multiple of train.eval_interval = 500"),
    (["eval.limit=0"], "eval.limit = 0"),
    (["eval.batch_size=0"], "eval.batch_size = 0"),
    (["parallel_config.pipeline_stage=2"], "pipeline_stage = 2"),
])
def test_the_eval_section_is_checked_with_the_config(sets, field):
    with pytest.raises(UserError) as e:
        load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"), ["eval.tasks=[shakespeare_cloze]", *sets])
    assert field in str(e.value)

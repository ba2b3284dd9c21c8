"""Other frameworks' logs (Megatron-LM, MindSpeed-LLM, MindFormers, torchtitan) read as ms_llm runs: every
fixture parsed (tests/fixtures/foreign/*/README.md names what printed it), diagnosed through the CLI, and
compared with compare-curves. The properties of cut, wrapped and interleaved logs are in tests/foreign/."""
import math
import os
import shutil

import pytest

from ms_llm.cli import main
from ms_llm.errors import UserError
from ms_llm.rundir.reader import load_run, log_format

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "foreign")


def fx(*parts):
    return os.path.join(FIX, *parts)


def losses(run):
    return {r["step"]: r.get("loss") for r in run.train}


# --- parsing -----------------------------------------------------------------------------------------------

def test_megatron_healthy_maps_the_line_and_the_argument_dump():
    run = load_run(fx("megatron", "healthy.log"))
    assert run.info["framework"] == "Megatron-LM" and "2026-01 or later" in run.info["version"]
    assert [r["step"] for r in run.train] == list(range(10, 301, 10))
    assert [(e["step"], round(e["val_loss"], 4)) for e in run.evals][0][0] == 100 and len(run.evals) == 3
    first = run.train[0]
    assert first["loss"] == pytest.approx(10.31511) and first["lr"] == pytest.approx(2e-4)
    assert first["grad_norm"] == pytest.approx(1.358) and first["loss_scale"] == 1.0
    assert first["skipped_interval"] == 0 and first["skipped"] == 0
    # tokens/s of the whole job: global batch x seq_length (from the dump) / the step's seconds
    assert first["tokens_per_s"] == pytest.approx(256 * 1024 / (first["ms_per_step"] / 1000))
    assert first["tokens"] == 2560 * 1024 and first["interval_s"] == pytest.approx(10 * first["ms_per_step"] / 1000)
    assert first["mem_gib"] == pytest.approx(21234.56 / 1024)  # '[Rank 7] (after 10 iterations) memory (MB) | ...'
    assert run.cfg("model.num_layers") == 12 and run.cfg("model.seq_length") == 1024
    assert run.cfg("train.warmup_steps") == 30 and run.cfg("train.lr_schedule") == "cosine"
    assert run.cfg("train.beta2") == 0.95 and run.cfg("precision.compute_dtype") == "bfloat16"
    assert run.cfg("parallel_config.optimizer_shard") is True and run.max_steps == 300
    assert run.final == {"steps": 300} and run.status == "finished"
    assert "data_wait_frac" in dict(run.lacks) and "tokens_per_s" not in dict(run.lacks)


def test_megatron_left_out_loss_is_nan_when_the_mean_was_nan():
    """2023-11's line prints the loss only when its mean is > 0: a NaN mean leaves it out, and the interval's
    mean (as ms_llm logs it) is NaN; before that the loss is the printed one."""
    run = load_run(fx("megatron", "nonfinite.log"))
    by = losses(run)
    assert by[130] == pytest.approx(6.90903) and all(math.isnan(by[s]) for s in range(140, 201, 10))
    assert math.isnan(run.train[-1]["grad_norm"]) and "2023-11" in run.info["version"]


def test_megatron_skipped_iterations_and_a_falling_scale():
    run = load_run(fx("megatron", "loss_scale.log"))
    scales = [r["loss_scale"] for r in run.train]
    assert scales[0] == 65536.0 and min(scales) == 1.0
    skipped = [r["skipped_interval"] for r in run.train]
    assert run.train[-1]["skipped"] == sum(skipped) > 100
    assert run.cfg("precision.compute_dtype") == "float16" and run.cfg("precision.loss_scale") == "dynamic"
    # an interval whose last iteration was skipped prints no grad norm: the record has none, not a zero
    assert any("grad_norm" not in r for r in run.train)


def test_megatron_all_skipped_interval_has_no_loss(tmp_path):
    """The first interval of an fp16 run can skip every iteration: Megatron prints no 'lm loss' (nothing to
    average). That is no loss at all, not a NaN."""
    line = (" iteration       10/ 1000000 | consumed samples:           40 | elapsed time per iteration (ms): 356.2 |"
            " learning rate: 0.000E+00 | global batch size:     4 | loss scale: 8388608.0 | number of skipped "
            "iterations:  10 | number of nan iterations:   0 |\n")
    later = line.replace("10/", "20/").replace("    40 |", "    80 |").replace(
        "loss scale:", "lm loss: 1.005022E+01 | loss scale:").replace("iterations:  10", "iterations:   0")
    path = tmp_path / "fp16_start.log"
    path.write_text(line + later)
    run = load_run(str(path))
    assert run.train[0]["loss"] is None and run.train[0]["skipped_interval"] == 10
    assert run.train[1]["loss"] == pytest.approx(10.05022)


def test_mindspeed_folder_reads_the_rank_that_printed():
    run = load_run(fx("megatron", "slowdown"))
    assert run.info["framework"] == "MindSpeed-LLM" and run.info["rank_read"] == 3
    assert len(run.info["files"]) == 4 and len(run.train) == 30
    assert run.cfg("model.arch") == "llama" and run.cfg("model.tie_embeddings") is False


def test_pasted_log_joins_wrapped_lines_and_reads_a_cut_one_to_its_last_whole_field():
    whole = {r["step"]: r for r in load_run(fx("megatron", "healthy.log")).train}
    run = load_run(fx("megatron", "pasted.log"))
    assert run.skipped["wrapped lines joined"] == 17 and run.skipped["cut lines (read up to their last whole field)"] == 1
    *done, cut = run.train
    for r in done:
        assert {k: v for k, v in r.items() if k not in ("tokens_per_s", "tokens", "interval_s")} == \
            {k: v for k, v in whole[r["step"]].items() if k not in ("tokens_per_s", "tokens", "interval_s", "mem_gib")}
    assert cut["step"] == 130 and cut["grad_norm"] == whole[130]["grad_norm"] and "skipped_interval" not in cut
    assert run.config == {} and "config" in dict(run.lacks)


def test_mindformers_workers_with_the_yaml_beside_them():
    run = load_run(fx("mindformers", "healthy"))
    assert run.info["framework"] == "MindFormers" and "2024-10 or later" in run.info["version"]
    assert [r["step"] for r in run.train] == list(range(5, 201, 5)) and run.info["ranks"] == [0, 1, 2, 3]
    assert run.skipped["lines repeated by several ranks (or printed twice)"] == 3 * 40
    r = run.train[0]
    assert r["loss"] == pytest.approx(9.786) and r["lr"] == pytest.approx(1.25e-5)
    assert r["grad_norm"] == pytest.approx(2.2096748) and r["tflops"] == pytest.approx(152.437)
    assert r["tokens_per_s"] == pytest.approx(64 * 4096 / (r["ms_per_step"] / 1000))
    # the YAML's warmup_ratio 0.03 of the run's 200 steps (the log's steps per epoch x the global batch)
    assert run.cfg("train.warmup_steps") == 6 and run.cfg("train.max_steps") == 200
    assert run.cfg("precision.compute_dtype") == "float16" and run.final == {"steps": 200}


def test_mindformers_pipeline_placeholder_and_skip_on_global_norm():
    run = load_run(fx("mindformers", "skip_norm"))
    assert run.info["rank_read"] == 1  # the last stage: rank 0 printed the placeholder loss 0.000
    assert run.skipped["placeholder losses of pipeline stages without the loss"] == 161
    assert all(isinstance(r["loss"], float) and r["loss"] > 1 for r in run.train)
    skips = [e["step"] for e in run.events if e["event"] == "anomaly_skip"]
    assert skips == [121, 122, 160, 161, 162]
    assert [e["step"] for e in run.events if e["event"] == "halted"] == [162]


@pytest.mark.parametrize("folder, version, field", [
    ("loss_scale", "2023-09 to 2024-06", "skipped_interval"),
    ("old_form", "2023-03 to 2023-09", "loss_mean_so_far"),
])
def test_mindformers_older_lines(folder, version, field):
    run = load_run(fx("mindformers", folder))
    assert version in run.info["version"] and all(field in r for r in run.train)
    assert all(isinstance(r["ms_per_step"], float) for r in run.train)


def test_mindformers_overflow_and_nan_stop():
    run = load_run(fx("mindformers", "loss_scale"))
    assert run.train[-1]["loss_scale"] == 1.0 and run.train[-1]["skipped"] > 80
    nan = load_run(fx("mindformers", "nonfinite"))
    assert math.isnan(nan.train[-1]["loss"]) and nan.train[-1]["step"] == 151
    assert {"nonfinite", "halted"} <= {e["event"] for e in nan.events}


def test_torchtitan_colours_rank_prefixes_separators_and_toml():
    run = load_run(fx("torchtitan", "healthy"))
    assert run.info["framework"] == "torchtitan" and run.info["ranks"] == [0, 1]
    assert [r["step"] for r in run.train] == [1] + list(range(10, 201, 10))
    r = run.train[1]
    assert r["loss"] == pytest.approx(7.26657, abs=0.5) and r["tokens_per_s_per_device"] > 10000  # '10,0xx'
    assert r["tokens_per_s"] == 2 * r["tokens_per_s_per_device"] and 0 < r["mfu"] < 0.2
    assert r["mem_gib"] == 66.91 and len(run.evals) == 2
    assert run.cfg("model.seq_length") == 8192 and run.cfg("train.warmup_steps") == 20
    assert run.cfg("train.min_lr") == pytest.approx(3e-5) and run.cfg("parallel_config.data_parallel") == 2
    assert run.cfg("train.global_batch_size") == 2 and run.cfg("train.beta2") == 0.95


def test_torchtitan_pipeline_stage_placeholder():
    run = load_run(fx("torchtitan", "slowdown"))
    assert run.info["rank_read"] == 1 and run.skipped["placeholder losses of pipeline stages without the loss"] == 200
    assert all(r["loss"] > 0 for r in run.train)


def test_torchtitan_old_line():
    run = load_run(fx("torchtitan", "nonfinite"))
    assert "2024-03 to 2024-11" in run.info["version"] and math.isnan(losses(run)[60])
    assert "tokens_per_s" in dict(run.lacks) or all("tokens_per_s" in r for r in run.train)


def test_forced_format_and_bad_input(tmp_path):
    with log_format("mindformers"), pytest.raises(UserError, match="read as MindFormers: no training line"):
        load_run(fx("megatron", "healthy.log"))
    notes = tmp_path / "notes.txt"
    notes.write_text("nothing to see here\n")
    with pytest.raises(UserError, match="holds no training line"):
        load_run(str(notes))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no metrics.jsonl.*nor a folder of training logs"):
        load_run(str(tmp_path / "empty"))


# --- diagnose through the CLI --------------------------------------------------------------------------------

CASES = [  # (path, framework, exit code, first finding or None, findings that must be there)
    (("megatron", "healthy.log"), "Megatron-LM", 0, None, []),
    (("megatron", "nonfinite.log"), "Megatron-LM", 1, "[error] loss became NaN/Inf at step 140", []),
    (("megatron", "loss_scale.log"), "Megatron-LM", 1, "[warning] frequent loss-scale overflows", []),
    (("megatron", "slowdown"), "MindSpeed-LLM", 1, "[warning] uneven (saw-toothed) throughput", []),
    (("mindformers", "healthy"), "MindFormers", 0, None, []),
    (("mindformers", "nonfinite"), "MindFormers", 1, "[error] loss became NaN/Inf at step 151", []),
    (("mindformers", "loss_scale"), "MindFormers", 1, "[warning] frequent loss-scale overflows", []),
    (("mindformers", "slowdown"), "MindFormers", 1, "[warning] uneven (saw-toothed) throughput", []),
    (("mindformers", "skip_norm"), "MindFormers", 1, None, ["[warning] the anomaly guard acted 5 time(s)"]),
    (("torchtitan", "healthy"), "torchtitan", 0, None, []),
    (("torchtitan", "nonfinite"), "torchtitan", 1, "[error] loss became NaN/Inf at step 60", []),
    (("torchtitan", "slowdown"), "torchtitan", 1, "[warning] uneven (saw-toothed) throughput", []),
]


@pytest.mark.parametrize("parts, framework, code, first, present", CASES, ids=["/".join(c[0]) for c in CASES])
def test_diagnose_fixture(capsys, parts, framework, code, first, present):
    assert main(["diagnose", fx(*parts)]) == code
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"read as a {framework} log")
    findings = [line for line in lines if line.startswith("[")]
    if code == 0:
        assert all(f.startswith("[info]") for f in findings), findings
    if first:
        assert findings[0] == first, findings
    for p in present:
        assert p in findings, findings
    # what the log lacks is said once per rule, after the findings
    needs = [line for line in lines if line.startswith("  - ") and "this " + framework + " log has no" in line]
    assert len(needs) == len(set(needs)) and (not needs or "not judged" in out)
    assert "config note: train.clip_grad = 0" not in out  # absent is not "off"


def test_diagnose_format_flag_forces_the_reader(capsys):
    assert main(["diagnose", fx("megatron", "healthy.log"), "--format", "torchtitan"]) == 2
    assert "read as torchtitan: no training line" in capsys.readouterr().err
    assert main(["diagnose", fx("megatron", "healthy.log"), "--format", "megatron"]) == 0


def test_a_log_without_a_config_is_not_judged_on_settings(capsys):
    assert main(["diagnose", fx("megatron", "pasted.log")]) == 0
    out = capsys.readouterr().out
    assert "config note" not in out and "the settings rules (each setting against the published configurations)" in out


# --- compare-curves and report ---------------------------------------------------------------------------------

def test_compare_curves_two_logs_by_step(capsys):
    assert main(["compare-curves", fx("megatron", "pasted.log"), fx("megatron", "healthy.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A read as a Megatron-LM log") and "within tolerance at all 9 common steps" in out


def test_compare_curves_by_tokens_parts_where_the_runs_part(capsys):
    assert main(["compare-curves", fx("megatron", "loss_scale.log"), fx("megatron", "healthy.log"),
                 "--align", "tokens"]) == 1
    out = capsys.readouterr().out
    assert "29 common token counts 2,621,440..78,643,200" in out and "PARTED at tokens" in out


def test_compare_curves_tokens_interpolates_where_counts_do_not_meet(tmp_path, capsys):
    src = open(fx("megatron", "healthy.log")).read()
    half = src.replace("seq_length ...................................... 1024",
                       "seq_length ...................................... 1000")
    p = tmp_path / "half_batch.log"
    p.write_text(half)
    assert main(["compare-curves", fx("megatron", "healthy.log"), str(p), "--align", "tokens"]) in (0, 1)
    out = capsys.readouterr().out
    assert "(interpolated at A's token counts)" in out


def test_compare_curves_tokens_needs_the_batch_shape(capsys):
    assert main(["compare-curves", fx("megatron", "pasted.log"), fx("megatron", "healthy.log"),
                 "--align", "tokens"]) == 2
    assert "--align tokens" in capsys.readouterr().err


def test_report_of_a_log_is_written_beside_it(tmp_path, capsys):
    log = tmp_path / "train.log"
    shutil.copy(fx("megatron", "nonfinite.log"), log)
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "read as a Megatron-LM log" in out
    html = (tmp_path / "train.report.html").read_text(encoding="utf-8")
    assert "loss became NaN/Inf at step 140" in html


def test_a_value_cut_at_the_end_of_a_log_is_not_misread(tmp_path):
    """A paste or a crash that ends inside a number ('loss: 6.04' of 'loss: 6.049') leaves that field out."""
    body = open(fx("mindformers", "healthy", "worker_0.log")).read()
    at = body.index("loss: 6.049")  # a line's loss, cut after its first digits
    run = read_text(tmp_path, body[:at + len("loss: 6.04")])
    assert "loss" not in run.train[-1] and run.skipped["cut lines (read up to their last whole field)"] == 1
    tt = open(fx("torchtitan", "healthy", "train.log")).read()
    at = tt.index("tps: 10,", tt.index("step: 50"))
    run = read_text(tmp_path, tt[:at + len("tps: 10")])  # "10" would read as a number
    assert "tokens_per_s_per_device" not in run.train[-1] and run.train[-1]["step"] == 50


def read_text(tmp_path, body, name="cut.log"):
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return load_run(str(path))


def test_a_log_without_its_dtype_names_both_causes_of_overflows(capsys):
    """MindFormers' loss line does not say the compute dtype: a collapsing loss scale is float16's range or a
    NaN source, and neither is named with high confidence."""
    assert main(["diagnose", fx("mindformers", "loss_scale")]) == 1
    out = capsys.readouterr().out
    block = out[out.index("[warning] frequent loss-scale overflows"):]
    block = block[:block.index("actions:")]
    assert "the log does not say the dtype) [confidence: medium]" in block and "[confidence: high]" not in block

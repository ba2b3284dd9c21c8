"""`ms-llm runs`: the table of runs under a folder, and `--diff A B` (config and environment differences)."""
import json
import os

from ms_llm.cli import main
from ms_llm.rundir.reader import diff_runs, list_runs
from test_diagnose import healthy, write_run


def make_runs(root):
    """finished (2000 steps), stopped (preempted at 1000), crashed (no `final`), plus a folder that is no run."""
    write_run(root / "a-finished", healthy(seed=1))
    stopped = [r for r in healthy(seed=2) if r["step"] <= 1000] + [{"step": 1000, "event": "preempted", "signal": 15}]
    write_run(root / "b-stopped", stopped, ["train.lr=3e-4", "model.num_layers=6"],
              info={"start_time": "2026-01-02T09:00:00", "host": "node7", "git_revision": "def456",
                    "versions": {"python": "3.11.7", "mindspore": "2.3.1", "numpy": "1.26.4", "ms_llm": "0.1.0"},
                    "parallel": {"world_size": 8, "data_parallel": 8, "model_parallel": 1, "pipeline_stage": 1}})
    write_run(root / "group" / "c-crashed", healthy(seed=3)[:12], final=False,
              info={"start_time": "2026-01-03T09:00:00"})
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a run")


def test_listing_columns_and_status(tmp_path, capsys):
    make_runs(tmp_path)
    rows = {r["name"]: r for r in list_runs(str(tmp_path))}
    assert set(rows) == {"a-finished", "b-stopped", os.path.join("group", "c-crashed")}
    a, b, c = rows["a-finished"], rows["b-stopped"], rows[os.path.join("group", "c-crashed")]
    assert (a["status"], b["status"], c["status"]) == ("finished", "stopped", "running-or-crashed")
    assert (a["steps"], a["max_steps"], b["steps"], c["steps"]) == (2000, 2000, 1000, 550)
    vals = [r["val_loss"] for r in healthy(seed=1) if "val_loss" in r]
    assert a["best_val_loss"] == min(vals) and a["final_val_loss"] == vals[-1]
    assert c["final_val_loss"] is None and c["best_val_loss"] is not None
    assert 14000 < a["tokens_per_s"] < 16000 and a["params"] == 804224 and a["layers"] == 4
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["run", "started", "model"]
    assert "gpt2 4L h128 804K" in out and "2000/2000" in out and "running-or-crashed" in out
    assert main(["runs", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"]
    assert [r["name"] for r in listed] == ["a-finished", "b-stopped", os.path.join("group", "c-crashed")]  # by start


def test_diff_shows_config_and_environment(tmp_path, capsys):
    make_runs(tmp_path)
    a, b = str(tmp_path / "a-finished"), str(tmp_path / "b-stopped")
    d = diff_runs(a, b)
    config = {k: (va, vb) for k, va, vb in d["config"]}
    assert config == {"train.lr": (1e-3, 3e-4), "model.num_layers": (4, 6)}
    env = {k: (va, vb) for k, va, vb in d["environment"]}
    assert env["versions.mindspore"] == ("2.10.0", "2.3.1") and env["host"] == ("vm", "node7")
    assert env["git_revision"] == ("abc123", "def456") and env["parallel.data_parallel"] == (1, 8)
    assert "versions.python" not in env
    assert main(["runs", "--diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "train.lr" in out and "A: 0.001" in out and "B: 0.0003" in out and "versions.mindspore" in out
    assert main(["runs", "--diff", a, a, "--json"]) == 0
    same = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert same["config"] == [] and same["environment"] == []


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["runs", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    run = write_run(tmp_path / "runs" / "r", healthy())
    assert main(["runs", "--diff", str(tmp_path / "x"), run]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main(["runs", "--diff", run, str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["runs", str(tmp_path / "x")]) == 0  # an empty folder is not an error
    assert "no runs under" in capsys.readouterr().out


def test_a_config_this_version_cannot_load_reads_with_the_schemas_defaults(tmp_path):
    """A run written by another version (a retired key makes the typed load fail, so the raw YAML is kept) is read
    section by section through the schema: its own values where they read, the schema's defaults elsewhere. The
    schedule rule then judges the LR the run really had (min_lr 1e-4 and beta2 0.99 from the schema, not
    0.0 / 0.999 restated by a reader)."""
    import yaml

    from ms_llm.config.schema import TrainConfig
    from ms_llm.diagnose.rules.schedule import suspects
    from ms_llm.rundir.reader import load_run
    from ms_llm.train.lr_schedule import lr_at

    run_dir = tmp_path / "old"
    write_run(run_dir, healthy(seed=1)[:20])
    with open(run_dir / "config.yaml", "w") as f:
        yaml.safe_dump({"train": {"lr": 1e-3, "max_steps": 200, "decay_steps": 800, "beta2": "fast",
                                  "gradient_aggregation_group": 4}, "model": {"vocab_size": 66}}, f)
    run = load_run(str(run_dir))
    assert run.config_note  # the typed load failed: this is the raw YAML
    train = run.section("train")
    assert (train.lr, train.max_steps, train.decay_steps) == (1e-3, 200, 800)
    assert (train.min_lr, train.beta2) == (TrainConfig().min_lr, TrainConfig().beta2)  # unreadable value: default
    late = next(s for s in suspects(run) if s.id == "decay_late")
    end = lr_at(199, TrainConfig(lr=1e-3, max_steps=200, decay_steps=800))
    assert f"the run ends with the LR at {end:.4g}" in late.setting, late.setting

import pytest

from ms_llm.config import load_config, check_against_dataset
from ms_llm.train.setup.resolve import resolve
from ms_llm.errors import UserError


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_defaults_and_typed_overrides(tmp_path):
    cfg = load_config(write(tmp_path, "model:\n  num_layers: 4\ntrain:\n  lr: 1e-3\n"),
                      ["model.num_layers=6", "train.lr=3e-4", "model.bias=true", "recompute_config.recompute=[1, 2]",
                       "model.vocab_size=null"])
    assert cfg.model.num_layers == 6 and isinstance(cfg.model.num_layers, int)
    assert cfg.train.lr == pytest.approx(3e-4) and isinstance(cfg.train.lr, float)
    assert cfg.model.bias is True
    assert cfg.recompute_config.recompute == [1, 2]
    assert cfg.model.vocab_size is None
    # derived values are filled in so config.yaml shows what ran
    assert cfg.model.num_kv_heads == cfg.model.num_heads
    assert cfg.model.ffn_hidden_size == 4 * cfg.model.hidden_size


def test_yaml_1e_minus_3_string_is_read_as_float(tmp_path):
    # PyYAML reads '1e-3' (no dot) as a string; users write it that way all the time
    assert load_config(write(tmp_path, "train:\n  lr: 1e-3\n")).train.lr == pytest.approx(1e-3)


def test_preset_then_explicit_keys(tmp_path):
    cfg = load_config(None, ["model.preset=llama2-7b", "model.num_layers=2"])
    assert cfg.model.hidden_size == 4096 and cfg.model.num_layers == 2 and cfg.model.ffn_hidden_size == 11008


@pytest.mark.parametrize("override, words", [
    ("model.hiden_size=3", ["unknown key 'hiden_size'", "section 'model'", "did you mean 'hidden_size'"]),
    ("trian.lr=1", ["unknown config section 'trian'", "did you mean 'train'"]),
    ("model.num_layers=four", ["model.num_layers", "'four'", "expected int"]),
    ("train.lr=fast", ["train.lr", "'fast'", "expected float"]),
    ("model.bias=maybe", ["model.bias", "expected bool"]),
    ("precision.compute_dtype=fp16", ["precision.compute_dtype", "did you mean 'float16'"]),
    ("model.num_heads=5", ["hidden_size = 128", "num_heads = 5", "divisible"]),
    ("train.micro_batch_size=5", ["global_batch_size = 12", "micro_batch_size = 5"]),
    ("model.dropout=1.5", ["model.dropout = 1.5"]),
    ("train.max_steps=0", ["train.max_steps = 0", "positive"]),
    ("train.eval_steps=-1", ["train.eval_steps", "-1"]),
    ("data.extra_val=/some/dataset train.eval_steps=0", ["data.extra_val = '/some/dataset'", "train.eval_steps = 0",
                                                        "turns validation off", "data.extra_val: null"]),
])
def test_validation_messages_name_field_value_and_fix(override, words):
    with pytest.raises(UserError) as e:
        load_config(None, override.split())
    for w in words:
        assert w in str(e.value), str(e.value)


def test_global_batch_must_divide_by_micro_times_data_parallel():
    cfg = load_config(None, ["train.global_batch_size=12", "train.micro_batch_size=4"])
    assert resolve(cfg, 1, "CPU").parallel.accumulation == 3  # derived, not configured
    with pytest.raises(UserError, match="data_parallel × micro_batch_size = 2 × 4 = 8"):
        resolve(cfg, 2, "CPU")
    cfg = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=4"])
    resolved = resolve(cfg, 2, "CPU")
    assert resolved.parallel.accumulation == 2 and resolved.cfg.parallel_config.data_parallel == 2
    assert cfg.parallel_config.data_parallel is None  # the loaded config is left as it was


def test_a_loaded_config_is_data_that_nothing_changes():
    import dataclasses

    cfg = load_config(None, [])
    assert cfg.model.num_kv_heads == 4 and cfg.model.ffn_hidden_size == 512  # derived once, at load
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.vocab_size = 66
    resolved = check_against_dataset(cfg, {"seq_length": 64, "vocab_size": 66}, "d")
    assert resolved.model.vocab_size == 66 and cfg.model.vocab_size is None


def test_resolve_fills_in_the_launch_the_data_and_the_strategy_dir_once():
    import dataclasses

    cfg = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=4"])
    r = resolve(cfg, 2, "CPU", {"seq_length": 64, "vocab_size": 66}, "runs/x/strategy")
    # data parallel alone writes no strategy file: the path stays unset (it would tie the compile cache's key to
    # the run directory)
    assert (r.cfg.parallel_config.data_parallel, r.cfg.model.vocab_size, r.cfg.checkpoint.strategy_dir) == \
        (2, 66, None)
    semi = resolve(load_config(None, ["parallel_config.model_parallel=2"]), 2, "Ascend",
                   {"seq_length": 64, "vocab_size": 66}, "runs/x/strategy")
    assert semi.parallel.semi_auto and semi.cfg.checkpoint.strategy_dir == "runs/x/strategy"
    assert (r.parallel.dp, r.parallel.accumulation) == (2, 2)
    assert cfg.parallel_config.data_parallel is None and cfg.model.vocab_size is None  # the loaded one is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cfg = cfg


def test_data_parallel_must_match_world_size():
    cfg = load_config(None, ["parallel_config.data_parallel=4"])
    with pytest.raises(UserError, match="there are 2 devices"):
        resolve(cfg, 2, "CPU")


def test_model_parallel_refused_on_cpu_with_one_clear_message():
    cfg = load_config(None, ["parallel_config.model_parallel=2"])
    with pytest.raises(UserError, match="needs Ascend"):
        resolve(cfg, 2, "CPU")


def test_config_must_fit_the_dataset():
    manifest = {"seq_length": 64, "vocab_size": 66, "max_token_id": 65}
    cfg = load_config(None, ["model.seq_length=128"])
    with pytest.raises(UserError, match="seq_length = 128 is larger"):
        check_against_dataset(cfg, manifest, "d")
    cfg = load_config(None, ["model.vocab_size=50"])
    with pytest.raises(UserError, match="vocab_size = 50 is smaller"):
        check_against_dataset(cfg, manifest, "d")
    cfg = load_config(None, [])
    assert check_against_dataset(cfg, manifest, "d").model.vocab_size == 66


def test_bad_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="not valid YAML at line 3"):
        load_config(write(tmp_path, "model:\n  num_layers: 4\n   hidden_size: 3\n"))
    with pytest.raises(UserError, match="must hold a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(UserError, match="section 'model' must be a mapping"):
        load_config(write(tmp_path, "model: 3\n"))


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  num_layers: 4\n  hidden_size: 128\n  num_layers: 6\ntrain:\n  lr: 1.0e-3\n")
    with pytest.raises(UserError, match=r"'model.num_layers' twice \(line 2 and line 4\)"):
        load_config(str(path))
    path.write_text("model:\n  num_layers: 4\ntrain:\n  lr: 1.0e-3\nmodel:\n  hidden_size: 64\n")
    with pytest.raises(UserError, match=r"'model' twice \(line 1 and line 5\)"):
        load_config(str(path))
    path.write_text("model:\n  num_layers: 4\ntrain:\n  lr: 1.0e-3\n")  # the same keys in other sections are fine
    assert load_config(str(path)).model.num_layers == 4


def alias_bomb(levels=9, fan=10):
    """The "billion laughs": each level lists the one below `fan` times, so it expands to fan**levels values."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nmodel:\n  num_layers: *a{levels}\n"


def test_an_alias_bomb_is_refused_at_once_with_bounded_memory(tmp_path):
    import time
    import tracemalloc

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    tracemalloc.start()
    began = time.perf_counter()
    with pytest.raises(UserError, match=r"bomb.yaml' is refused: its aliases expand to more than 100,000 values"):
        load_config(str(path))
    took = time.perf_counter() - began
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert took < 1.0, took  # the check counts each node once: ~100 nodes here, not 10^9 visits
    assert peak < 20 * 2**20, peak


def test_aliases_that_loop_or_nest_without_end_are_refused(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text("model: &m\n  x: *m\n")
    with pytest.raises(UserError, match="an alias refers to the node that contains it"):
        load_config(str(loop))
    deep = tmp_path / "deep.yaml"
    deep.write_text("model: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(UserError, match="nests its values more than 64 levels deep"):
        load_config(str(deep))
    with pytest.raises(UserError, match=r"--set 'model.num_layers=...' is refused: its aliases expand"):
        load_config(None, ["model.num_layers=" + alias_bomb().replace("\n", "\n")])


def test_a_few_anchors_still_work_and_an_oversized_file_is_refused_by_its_size(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("model: &m\n  num_layers: 2\ntrain:\n  max_steps: 7\n")
    assert load_config(str(path)).model.num_layers == 2
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (5 * 2**20) + "\n")
    with pytest.raises(UserError, match=r"big.yaml' is 5,242,883 bytes; a config is a few KiB"):
        load_config(str(big))

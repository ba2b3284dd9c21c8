"""The compile cache's key describes the graph: every key of the schema is in it, except those proven host-only
here, and the proof is a real one (it fails for keys that do shape the graph).

The proof of a host-only key: the step is built and compiled with the key at its default and with a changed
value, on two base configs (the tiny default, and one with dropout, accumulation 2, float16, the anomaly guard and
llama's layers); the two builds must have the same fingerprint (ms_llm.train.compile_cache.step_fingerprint: every
cell, attribute, primitive, constant tensor, parameter and input) and the compiled graphs the same IR (MindSpore's
own `anf_ir` of each step graph, graph names aside).
"""
import copy
import dataclasses
import os
import shutil
import typing

import pytest

from conftest import ROOT

BASES = {
    "tiny": [],
    "everything": ["model.arch=llama", "model.dropout=0.1", "train.micro_batch_size=2", "precision.compute_dtype=float16",
                   "train.anomaly={zscore: 6.0}"],
}
TINY = ["model.num_layers=1", "model.hidden_size=16", "model.num_heads=2", "model.seq_length=16",
        "train.global_batch_size=4", "train.micro_batch_size=4", "train.max_steps=20", "train.warmup_steps=2",
        "monitor.summary=false", "monitor.report=false", "monitor.telemetry_interval_s=null"]


def schema_paths(cls=None, prefix=""):
    """Every dotted key of the schema, subsections (optional ones too) walked into."""
    from ms_llm.config.schema import Config

    cls = cls or Config
    out = []
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        out.append(path)
        tp = typing.get_type_hints(cls)[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or \
            ([tp] if dataclasses.is_dataclass(tp) else [])
        for sub in inner:
            out += schema_paths(sub, path + ".")
    return out


def covered(path, host_only):
    return any(path == h or path.startswith(h + ".") for h in host_only)


def changed(d, path, value):
    d = copy.deepcopy(d)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value
    return d


def test_every_schema_key_is_in_the_cache_key_unless_proven_host_only():
    """Deny by default: changing any key outside HOST_ONLY changes the key's config part, and HOST_ONLY names only
    real keys (a key added to the schema later is covered without anyone remembering to add it)."""
    from ms_llm.config import load_config, to_dict
    from ms_llm.train.compile_cache import HOST_ONLY, graph_config

    paths = [p for p in schema_paths() if "." in p]  # keys, not the top-level sections
    assert len(paths) > 100
    assert [h for h in HOST_ONLY if h not in paths] == []
    base = to_dict(load_config(None, []))
    reference = graph_config(base)
    missing = [p for p in paths if not covered(p, HOST_ONLY) and graph_config(changed(base, p, "<changed>")) == reference]
    assert missing == []
    leaked = [h for h in HOST_ONLY if graph_config(changed(base, h, "<changed>")) != reference]
    assert leaked == []


# a changed value for each host-only key (the table must cover HOST_ONLY exactly)
def changed_values(dataset, other_dataset):
    return {
        "train.log_interval": 3, "train.eval_interval": 7, "train.eval_steps": 3, "train.stop_at_step": 5,
        "train.seed": 7, "train.stop_on": "[error]",
        "data.dataset_dir": other_dataset, "data.source": os.path.join(ROOT, "data", "tinyshakespeare.txt"),
        "data.tokenizer": "byte", "data.val_fraction": 0.2, "data.text_field": "body", "data.num_workers": 2,
        "data.blend": f"[[1.0, {dataset}]]", "data.extra_val": dataset,
        "checkpoint.save_interval": 5, "checkpoint.auto_resume": True, "checkpoint.keep_last": 1,
        "checkpoint.format": "safetensors", "checkpoint.async_save": True, "checkpoint.remote_dir": "/tmp/remote",
        "checkpoint.uploader": "ms_llm.checkpoint.remote:LocalUploader", "checkpoint.load_weights": "w.ckpt",
        "checkpoint.remote_endpoint": "http://127.0.0.1:9", "checkpoint.upload_budget_s": 5.0,
        "monitor.summary": True, "monitor.tensorboard": True, "monitor.report": True,
        "monitor.telemetry_interval_s": 5.0, "monitor.progress_bar": False, "monitor.peak_tflops": 100.0,
        "monitor.nan_check": True, "monitor.tensor_stats": "{every: 1}", "monitor.profile": "{start_step: 1}",
        "monitor.trackers": "[mlflow]", "monitor.tracker_project": "p", "monitor.diagnose": False,
        "eval.tasks": "[shakespeare_cloze]", "eval.interval": 7, "eval.limit": 10, "eval.at_start": False,
        "eval.include_path": "[/tmp/tasks]", "eval.num_fewshot": 1, "eval.batch_size": 4,
        "context.compile_cache": False, "context.num_threads": 1,
    }


def built_step(dataset, overrides, compile_graphs):
    """(fingerprint, normalised IR of each step graph or None) of the step a config builds."""
    from ms_llm.config import load_config
    from ms_llm.train import compile_cache
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [f"data.dataset_dir={dataset}", "data.source=null", *TINY, *overrides])
    s = open_session(cfg, echo=lambda *a: None)
    batches = s.next_batches()
    runner = StepRunner(s, use_compile_cache=False)
    inputs = runner.graph_inputs(s.loss.inputs(batches, count=False))
    fingerprint = compile_cache.step_fingerprint(s.step_cells, inputs)
    if not compile_graphs:
        return fingerprint, None
    runner.compile(batches)
    return fingerprint, [graph_ir(c) for c in s.step_cells]


def graph_ir(cell):
    """MindSpore's IR of a compiled cell as text, without the graph's name (it carries instance counters)."""
    from google.protobuf import text_format
    from mindspore.train import anf_ir_pb2

    from ms_llm.train.compile_cache import cell_graph_executor

    model = anf_ir_pb2.ModelProto()
    model.ParseFromString(cell_graph_executor()._graph_executor.get_func_graph_proto(cell.phase_cache["train"],
                                                                                     "anf_ir"))
    model.graph.name = ""
    return text_format.MessageToString(model)


@pytest.fixture(scope="module")
def datasets(dataset, tmp_path_factory):
    other = str(tmp_path_factory.mktemp("other") / "copy")
    shutil.copytree(dataset, other)
    return dataset, other


@pytest.fixture(scope="module")
def references(datasets):
    """{base: (fingerprint, IR)} of each base config's step, built and compiled once for the tests below."""
    built = {}

    def reference(base):
        if base not in built:
            built[base] = built_step(datasets[0], BASES[base], compile_graphs=True)
        return built[base]

    return reference


@pytest.mark.slow
@pytest.mark.parametrize("base", list(BASES))
def test_host_only_keys_leave_the_built_step_and_its_graphs_unchanged(datasets, references, base):
    from ms_llm.train.compile_cache import HOST_ONLY

    dataset, other = datasets
    values = changed_values(dataset, other)
    assert sorted(values) == sorted(HOST_ONLY)
    reference, reference_ir = references(base)
    # every host-only key changed at once: the same step (fingerprint) and the same graphs, op for op. A key that
    # shaped the step would change the fingerprint here too (no other key's change could undo it exactly), so the
    # step is built once per key only to name the keys when it does not hold.
    fingerprint, ir = built_step(dataset, BASES[base] + [f"{k}={v}" for k, v in values.items()], compile_graphs=True)
    if fingerprint != reference:
        differ = [k for k, v in values.items() if built_step(dataset, BASES[base] + [f"{k}={v}"], False)[0] != reference]
        pytest.fail(f"host-only keys that change the step: {differ or 'none alone, only together'}")
    assert ir == reference_ir


@pytest.mark.slow
def test_the_proof_fails_for_keys_that_shape_the_graph(datasets, references):
    """Not a vacuous proof: a learning rate (a constant baked into the graph), dropout (cells), the loss scale's
    window (a constant) and the micro-batch (input shapes, a second graph) each change the fingerprint; dropout and
    the micro-batch change the IR as well."""
    dataset, _ = datasets
    reference, reference_ir = references("tiny")
    for key in ("train.lr=0.002", "precision.scale_window=10", "train.clip_grad=0.5"):
        assert built_step(dataset, [key], False)[0] != reference, key
    for key in ("model.dropout=0.1", "train.micro_batch_size=2"):
        fingerprint, ir = built_step(dataset, [key], compile_graphs=True)
        assert fingerprint != reference and ir != reference_ir, key


def test_a_masked_steps_description_does_not_depend_on_the_batches_it_counted():
    """The loss mask counts each batch's masked-in targets on the host (loss_tokens_frac): were those counts part of
    the cell's description, the compile cache would be keyed on the first batch, and a fine-tuning run resumed at
    another step would never reuse its graphs."""
    from types import SimpleNamespace

    import mindspore as ms
    import numpy as np
    from ms_llm.train.compile_cache import describe_cell
    from ms_llm.train.losses.masked import LossMask

    mask = LossMask()
    before = describe_cell(mask)
    cols = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]], np.int32)
    batch = SimpleNamespace(loss_mask=ms.Tensor(cols), segments=ms.Tensor(np.ones_like(cols)),
                            ids=ms.Tensor(np.arange(10, dtype=np.int32).reshape(2, 5)))
    mask.inputs([batch], count=True, training=True)
    assert describe_cell(mask) == before
    assert mask.log_fields()["loss_tokens_frac"] == 0.75  # 6 of the 8 targets counted: the counts still work

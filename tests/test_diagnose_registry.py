"""The diagnosis's rules as the registry declares them (ms_llm/diagnose/registry.py): what each reads is what its
code reads, the order follows from it, every finding a rule returns is one it declares, and no rule changes a
finding another rule returned (the engine alone composes them, from Finding.explains)."""
import ast
import copy
import inspect
import re
import sys

from ms_llm.diagnose import engine, registry
from ms_llm.diagnose.common import memoised
from ms_llm.rundir.reader import load_run

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from synthetic_run import make_run  # noqa: E402

FOUND_READ = re.compile(r"""(?:"([a-z_]+)" in found|found\[\s*"([a-z_]+)"\s*\]|found\.get\(\s*"([a-z_]+)")""")


def literal_reads(fn):
    """The finding ids a rule's own source (and the module functions it calls with `found`) reads in `found`."""
    src = inspect.getsource(sys.modules[fn.__module__])
    tree = ast.parse(src)
    funcs = {n.name: ast.get_source_segment(src, n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo, ids = set(), [fn.__name__], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        body = funcs[name]
        ids |= {x for m in FOUND_READ.finditer(body) for x in m.groups() if x}
        # tuples of ids tested against found: for k in ("a", "b"): ... k in found
        for tup in re.findall(r"for k in \(([^)]*)\)", body):
            if re.search(r"\bk in found|found\[k\]", body):
                ids |= set(re.findall(r'"([a-z_]+)"', tup))
        todo += [c for c in re.findall(r"\b([a-z_]+)\(run, found", body) if c != name]
    return ids


def test_the_rules_run_in_an_order_that_follows_what_they_read():
    rules = registry.ordered_rules()
    position = {r.name: i for i, r in enumerate(rules)}
    assert len(position) == len(registry.REGISTERED)
    for r in rules:
        for other in rules:
            if other is not r and any(registry.overlap(x, f) for x in r.reads for f in other.finds):
                assert position[other.name] < position[r.name], (other.name, r.name)


def test_what_a_rule_declares_it_reads_covers_what_its_code_reads():
    for r in registry.ordered_rules():
        undeclared = {x for x in literal_reads(r.fn) if not any(registry.overlap(x, d) for d in r.reads)
                      and not r.finds_id(x)}
        assert not undeclared, f"{r.name} reads {sorted(undeclared)} in found without declaring it"


def runs(tmp_path):
    """Runs of the synthetic kind with the symptoms the rules look for: healthy, a NaN, a spike, a slow profile."""
    yield make_run(tmp_path / "healthy", steps=600, stats_every=100)
    yield make_run(tmp_path / "nan", steps=600, nan_at=300)
    yield make_run(tmp_path / "spike", steps=600, spike_at=250)
    yield make_run(tmp_path / "profiled", steps=600, profile=(100, 200), overrides=["train.warmup_steps=0"])
    yield make_run(tmp_path / "moe", steps=400, overrides=["model.arch=llama", "model.moe={num_experts: 4, top_k: 2}",
                                                            "model.num_heads=32"])


def test_every_finding_is_declared_by_its_rule_and_no_rule_edits_another_rules_finding(tmp_path):
    seen = set()
    for path in runs(tmp_path):
        run = load_run(path)
        found, snapshots = {}, {}
        with memoised():
            for r in registry.ordered_rules():
                for f in r.fn(run, found, None) or []:
                    assert r.finds_id(f.id), f"{r.name} returned {f.id}, which it does not declare"
                    found[f.id] = f
                    snapshots[f.id] = copy.deepcopy(f)
                    seen.add(f.id)
        for fid, f in found.items():
            assert f == snapshots[fid], f"a rule changed {fid} after the rule that found it returned it"
    assert {"loss_nonfinite", "divergence", "preemptions"} <= seen and any(i.startswith("config_") for i in seen), seen


def test_a_setting_that_explains_a_symptom_leads_it_and_comes_first(tmp_path):
    """The engine composes: the explaining finding's cause goes first in the symptom, and its group is ordered by
    the symptom's severity, the explanation first."""
    from ms_llm.diagnose.common import Explains, Finding, cause

    nan = Finding("loss_nonfinite", "error", "loss became NaN", [], [cause("overflow", "medium")], ["look"])
    other = Finding("data_wait", "warning", "data", [], [cause("readers", "medium")], ["readers"])
    setting = Finding("config_lr", "warning", "config: LR too high", ["train.lr = 10"],
                      [cause("LR too high", "high")], ["--set train.lr=1e-3"],
                      explains=[Explains("loss_nonfinite", cause("LR too high", "high"), "--set train.lr=1e-3",
                                         "train.lr = 10", key="train.lr")])
    out = engine.ordered(engine.compose({f.id: f for f in (other, nan, setting)}))
    assert [f.id for f in out] == ["config_lr", "loss_nonfinite", "data_wait"]
    assert out[1].causes[0].startswith("LR too high") and out[1].actions[0] == "--set train.lr=1e-3"
    assert "train.lr = 10" in out[1].evidence


def test_every_rule_runs_on_a_log_that_states_no_setting(tmp_path):
    """Another framework's log may state no setting at all (Run.cfg is None for each): every rule still runs, its
    causes saying the log does not state what they would quote (the engine's catch for such logs is not needed)."""
    for path in runs(tmp_path):
        run = load_run(path)
        run.config, run.info["framework"] = {}, "megatron"
        found = {}
        with memoised():
            for r in registry.ordered_rules():
                for f in r.fn(run, found, None) or []:  # raises on a setting read as a number
                    found[f.id] = f
        assert not [f for f in found.values() if f.id.startswith("config_")], "a setting judged that no log stated"

"""The house rules on imports, checked on the source (`ast`, so lazy imports inside functions count too):
no import circle anywhere in ms_llm/, and arrows point down between the packages (ARCHITECTURE.md)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = ("ms_llm.train", "ms_llm.data", "ms_llm.checkpoint", "ms_llm.monitor", "ms_llm.config", "ms_llm.nn",
        "ms_llm.parallel", "ms_llm.rundir")
TOOLS = ("ms_llm.debug", "ms_llm.diagnose", "ms_llm.report", "ms_llm.tune", "ms_llm.eval", "ms_llm.cli")
TOOL_PACKAGES = ("ms_llm.debug", "ms_llm.diagnose", "ms_llm.report", "ms_llm.tune", "ms_llm.eval")


def modules(package="ms_llm"):
    """{dotted module name: file path} of every module under the package (a package is its __init__)."""
    out = {}
    for base, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(base, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def import_graph(mods):
    """{module: set of ms_llm modules it imports}, at any depth of the file (function-level imports included).
    `from pkg import name` points at pkg.name when that is a module, else at pkg."""
    def target(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        deps = set()
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {target(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps |= {target(f"{node.module}.{a.name}") or target(node.module) for a in node.names}
        # a package's own submodules are its parts, not a dependency back up
        graph[name] = {d for d in deps if d and d != name and not d.startswith(name + ".")}
    return graph


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_ms_llm_has_no_import_circle():
    found = cycles(import_graph(modules()))
    assert not found, "import circles in ms_llm/ (lazy imports count): " + "; ".join(" -> ".join(c) for c in found)


def test_the_core_never_imports_the_tools_and_models_never_import_training():
    graph = import_graph({**modules(), **modules("model_zoo")})
    wrong = [f"{m} imports {d}" for m, deps in graph.items() for d in deps
             if (m.startswith(CORE) and d.startswith(TOOLS))
             or (m.startswith(("ms_llm.nn", "model_zoo")) and d.startswith(("ms_llm.train", "ms_llm.parallel",
                                                                             "ms_llm.monitor") + TOOLS))]
    assert not wrong, wrong


def test_generation_never_imports_training_and_evaluation_only_what_it_reads():
    """The KV cache and the generation loop work on a built model (`sample` and lm-eval both use them): nothing of
    ms_llm.train; evaluation reads run directories and checkpoints, never the training loop or another tool."""
    graph = import_graph({**modules(), **modules("model_zoo")})
    wrong = [f"{m} imports {d}" for m, deps in graph.items() for d in deps
             if (m.startswith(("ms_llm.generate", "ms_llm.nn.kv_cache")) and d.startswith("ms_llm.train"))
             or (m.startswith("ms_llm.eval") and (d == "ms_llm.train.trainer" or
                                                   (d.startswith(TOOLS) and not d.startswith("ms_llm.eval"))))]
    assert not wrong, wrong


def tool_arrows(graph):
    """'a imports b' for every import from one tool package into another."""
    def package(m):
        return next((t for t in TOOL_PACKAGES if m == t or m.startswith(t + ".")), None)
    return [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
            if package(m) and package(d) and package(m) != package(d)]


def test_the_tools_stand_side_by_side():
    """debug, diagnose, report, tune and eval never import each other: what they share (the run directory, the
    divergence criterion, the judgement of the first loss, the pages) lives below them, and ms_llm/cli.py wires one
    tool's output into another (the report's diagnosis)."""
    assert tool_arrows({"ms_llm.tune.x": {"ms_llm.diagnose.y", "ms_llm.tune.z"}}) == [
        "ms_llm.tune.x imports ms_llm.diagnose.y"]  # the check itself sees a planted arrow
    wrong = tool_arrows(import_graph(modules()))
    assert not wrong, wrong

"""The docs against the code: the README's command table against the parser `ms-llm --help` shows, the config
reference against the schema, and the README's test commands against what CI runs. Each reads files and builds
the parser in-process (no MindSpore import), so they belong to the fast tier."""
import argparse
import os
import re

from ms_llm.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
        return f.read()


def commands(parser, path=()):
    """{("debug", "nan"): its parser, ...}: every command and sub-command under `parser`."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[path + (name,)] = sub
                found.update(commands(sub, path + (name,)))
    return found


def has_subcommands(parser):
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def modes(parser):
    """The options of `parser` of which a call needs exactly one (a required mutually exclusive group), e.g.
    convert's --from-hf, --to-hf, ..."""
    return [max(a.option_strings, key=len) for g in parser._mutually_exclusive_groups if g.required
            for a in g._group_actions]


def command_table(readme):
    """The first cell of every row of the README's "## Commands" table."""
    section = readme.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [row.split("|")[1] for row in rows[2:]]  # past the header and the |---| line


def listed_commands(cells, known):
    """{command path: [the `ms-llm ...` spans naming it]} for the table's cells; a span naming no command of the
    parser is a stale row and fails here."""
    listed = {}
    for cell in cells:
        for span in re.findall(r"`ms-llm ([^`]*)`", cell):
            words = span.split()
            path = next((tuple(words[:n]) for n in range(len(words), 0, -1) if tuple(words[:n]) in known), None)
            assert path, f"the README's command table names `ms-llm {span}`, which `ms-llm --help` does not have"
            listed.setdefault(path, []).append(span)
    return listed


def test_the_readme_command_table_lists_every_command_and_mode():
    """Every command and sub-command of the parser (a command with sub-commands through its sub-commands) has a
    row, every mode of a command that takes exactly one (convert's --from-hf, --to-mindformers, ...) appears in its
    rows, and no row names a command that does not exist. A command added on a branch fails here until its row is
    written."""
    known = commands(build_parser())
    assert {("train",), ("debug", "lr-find"), ("convert",), ("compare-curves",)} <= set(known)  # the walk works
    listed = listed_commands(command_table(read("README.md")), known)
    missing = [" ".join(p) for p, sub in known.items() if p not in listed and not has_subcommands(sub)]
    assert not missing, f"README.md's command table lacks: {', '.join('ms-llm ' + m for m in missing)}"
    for path, sub in known.items():
        spans = " ".join(listed.get(path, []))
        absent = [m for m in modes(sub) if not re.search(rf"{re.escape(m)}(?![\w-])", spans)]
        assert not absent, f"README.md's rows for `ms-llm {' '.join(path)}` lack {', '.join(absent)}"


def test_the_walk_sees_sub_commands_and_modes():
    """The helpers above on a parser built here: a nested sub-command and each option of a required group are
    found, an optional group's are not, and a table row naming an unknown command is refused."""
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers()
    tool = sub.add_parser("tool").add_subparsers()
    leaf = tool.add_parser("leaf")
    group = leaf.add_mutually_exclusive_group(required=True)
    group.add_argument("--from-a")
    group.add_argument("--to-b")
    leaf.add_mutually_exclusive_group().add_argument("--optional")
    known = commands(parser)
    assert set(known) == {("tool",), ("tool", "leaf")}
    assert modes(known["tool", "leaf"]) == ["--from-a", "--to-b"]
    assert listed_commands(["`ms-llm tool leaf --from-a A`"], known) == {("tool", "leaf"): ["tool leaf --from-a A"]}
    try:
        listed_commands(["`ms-llm tool gone`", ""], {("other",): None})
    except AssertionError as e:
        assert "`ms-llm tool gone`" in str(e)
    else:
        raise AssertionError("a row naming an unknown command was accepted")


def test_the_config_reference_is_the_schema():
    """docs/configuration.md's key tables are generated from the schema (`python -m ms_llm.config.reference
    --update docs/configuration.md`): a key added, removed or re-documented without regenerating them fails here."""
    from ms_llm.config.reference import DOC, with_reference

    doc = read(DOC)
    assert "<!-- config-reference:start" in doc and "| `preset` |" in doc
    assert with_reference(doc) == doc, f"{DOC} is out of date: run python -m ms_llm.config.reference --update {DOC}"


def test_the_preset_help_names_every_preset():
    """model.preset's help is built from the presets themselves, so the reference cannot show a partial list."""
    from ms_llm.config.presets import PRESETS
    from ms_llm.config.reference import DOC

    row = next(line for line in read(DOC).splitlines() if line.startswith("| `preset` |"))
    assert all(re.search(rf"[ ,]{re.escape(name)}[,;]", row) for name in PRESETS), row


def test_the_readme_test_commands_are_the_ones_pytest_ini_and_ci_use():
    """The README's install and full-suite commands are what .ci/run runs, and its fast tier selects by the marker
    pytest.ini declares."""
    readme, ci = read("README.md"), read(".ci/run")
    assert re.search(r'^pip install -e "\.\[dev\]"$', readme, re.M) and re.search(r'^pip install -e "\.\[dev\]"$', ci, re.M)
    full = re.search(r"^(python -m pytest -q -rs --durations=25[^\n#]*? tests)\b", readme, re.M)
    assert full and re.search(rf"^{re.escape(full.group(1))}$", ci, re.M)
    assert re.search(r'^python -m pytest -q -m "not slow" tests\b', readme, re.M)
    assert re.search(r"^\s+slow:", read("pytest.ini"), re.M)


QUICKSTART = ["pip install -e .", "ms-llm train --config configs/shakespeare_char.yaml --run-dir runs/quickstart"]


def test_the_quickstart_installs_the_core_alone_and_trains():
    """Two commands, each on its own line: the first installs ms_llm without the test and reference packages (torch,
    transformers, ...), the second trains."""
    block = re.search(r"## Quickstart \(two commands\).*?```bash\n(.*?)```", read("README.md"), re.S).group(1)
    assert block.strip().splitlines() == QUICKSTART


def test_the_readme_opens_with_the_run_and_test_commands_and_stays_short():
    """A new reader finds how to run and how to test in the first 40 lines, and the whole page stays within 250."""
    readme = read("README.md").splitlines()
    first = readme[:40]
    for command in QUICKSTART + ['pip install -e ".[dev]"']:
        assert command in first, command
    assert any(line.startswith("python -m pytest -q -rs") for line in first)
    assert any(line.startswith('python -m pytest -q -m "not slow" tests') for line in first)
    assert len(readme) <= 250, len(readme)


def markdown_files():
    return ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                  if f.endswith(".md"))


def anchors(text):
    """GitHub's anchors for the headings of a Markdown text: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


# Paths in MindFormers' repository, which docs/from_mindformers.md and docs/parallel_planning.md cite as such.
MINDFORMERS_PATHS = ("configs/llama2/", "docs/mindformers/")


def test_every_link_and_repository_path_in_the_docs_exists():
    """A file moved or renamed (the diagnose package, the interop modules, ...) leaves no dangling `path` or
    [link](target#anchor) in README.md or docs/."""
    import glob

    broken = []
    for md in markdown_files():
        text = read(md)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(md), path)) if path else os.path.join(ROOT, md)
            if not os.path.exists(full):
                broken.append(f"{md}: link {target}")
            elif anchor and full.endswith(".md") and anchor not in anchors(open(full, encoding="utf-8").read()):
                broken.append(f"{md}: link {target} (no such heading)")
        for path in re.findall(r"`((?:ms_llm|model_zoo|tests|benchmarks|configs|docs)/[\w./*-]*)`", text):
            if not glob.glob(os.path.join(ROOT, path)) and not path.startswith(MINDFORMERS_PATHS):
                broken.append(f"{md}: path {path}")
    assert not broken, "\n".join(broken)


def documented_command_lines():
    """(file, line number, text) of every `ms-llm ...` command the docs show: inline code spans and the lines of
    code blocks, each cut at a shell separator (a pipe, &&, ;) and at a comment."""
    found = []
    for md in markdown_files():
        for number, line in enumerate(read(md).splitlines(), 1):
            for span in re.findall(r"`(ms-llm [^`]+)`", line) or ([line] if "ms-llm " in line and "`" not in line else []):
                for part in re.split(r"\|\||&&|[|;]|\s#\s", span):
                    start = part.find("ms-llm ")
                    if start >= 0 and re.match(r"ms-llm [a-z]", part[start:]):
                        found.append((md, number, part[start:].strip()))
    return found


def resolve_documented(text, known):
    """The command path and the options a documented `ms-llm ...` line names, against the parser's commands."""
    words = text.split()[1:]
    path = next((tuple(words[:n]) for n in range(min(len(words), 3), 0, -1) if tuple(words[:n]) in known), None)
    options = [m.group(1) for w in words if (m := re.match(r"\[*(--[a-z][\w-]*)", w))]
    return path, options


def test_every_documented_command_runs_its_help():
    """Each `ms-llm ...` line of README.md and docs/ names a command that exists, its `--help` runs, and every option
    the line shows is one that command takes: a renamed or removed command or flag fails here, not in a user's
    shell."""
    import contextlib
    import io

    parser = build_parser()
    known = commands(parser)
    lines = documented_command_lines()
    assert len(lines) > 100, len(lines)  # the walk sees the docs
    wrong, helped = [], set()
    for md, number, text in lines:
        path, options = resolve_documented(text, known)
        if path is None:
            wrong.append(f"{md}:{number}: `{text}` names no ms-llm command")
            continue
        if path not in helped:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    build_parser().parse_args([*path, "--help"])
                except SystemExit as e:
                    assert e.code == 0, (path, e.code)
            assert out.getvalue().startswith(f"usage: ms-llm {' '.join(path)}"), out.getvalue()[:200]
            helped.add(path)
        takes = {o for a in known[path]._actions for o in a.option_strings}
        wrong += [f"{md}:{number}: `{text}`: ms-llm {' '.join(path)} takes no {o}" for o in options if o not in takes]
    assert not wrong, "\n".join(wrong)


def test_the_documented_command_walk_catches_a_stale_command_and_flag():
    known = commands(build_parser())
    assert resolve_documented("ms-llm debug lr-find --config C", known) == (("debug", "lr-find"), ["--config"])
    assert resolve_documented("ms-llm lr-find --config C", known)[0] is None
    path, options = resolve_documented("ms-llm convert --from-hf DIR [--no-such-flag X]", known)
    assert path == ("convert",) and "--no-such-flag" in options


# Words of how the project was made, not of the project: a reader has no issue tracker, brief or work session to
# look up.
MAKING_WORDS = re.compile(r"\bissue \d+|\bthe brief\b|\b(?:this|that|another|same|a later|an earlier) session\b", re.I)


def test_the_docs_speak_of_the_project_not_of_how_it_was_made():
    found = [f"{md}:{n}: {m.group(0)!r}" for md in markdown_files() for n, line in enumerate(read(md).splitlines(), 1)
             for m in [MAKING_WORDS.search(line)] if m]
    assert not found, "\n".join(found)
    assert MAKING_WORDS.search("the measured case of issue 35") and not MAKING_WORDS.search("open_session(cfg)")

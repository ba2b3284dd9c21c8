"""Every environment variable ms_llm reads is declared in ms_llm/env.py, and every bad value of one ends in one
paragraph (or, when empty, in the default said once)."""
import os
import pathlib
import re

import pytest

from ms_llm import env
from ms_llm.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
READS = re.compile(r"""(?:os\.environ\.get\(|os\.environ\[|os\.getenv\(|os\.environ\.setdefault\(|in os\.environ\b)"""
                   r"""|["']([A-Z][A-Z0-9_]+)["']\s+in\s+os\.environ""")
NAME = re.compile(r"""(?:os\.environ\.get|os\.getenv|os\.environ\.setdefault)\(\s*["']([A-Z][A-Za-z0-9_]+)["']"""
                  r"""|os\.environ\[\s*["']([A-Z][A-Za-z0-9_]+)["']\s*\]|["']([A-Z][A-Za-z0-9_]+)["']\s+in\s+os\.environ""")


def names_read(text):
    return {next(g for g in m.groups() if g) for m in NAME.finditer(text)}


def test_every_variable_the_source_reads_is_declared():
    found = {}
    for path in (ROOT / "ms_llm").rglob("*.py"):
        for name in names_read(path.read_text(encoding="utf-8")):
            found.setdefault(name, path.relative_to(ROOT))
    written_only = {"MS_COMPILER_CACHE_PATH", "MS_COMPILER_CACHE_ENABLE"}  # set for MindSpore, never read back
    missing = {n: str(p) for n, p in found.items() if n not in env.DECLARED and n not in written_only}
    assert not missing, f"declare these in ms_llm/env.py with their kind: {missing}"
    assert "ASCEND_HOME_PATH" in found and "MS_ROLE" in found  # the walk sees the reads it must see


def test_the_launcher_variables_are_declared():
    from ms_llm.train.setup.context import LAUNCHER_VARS

    assert set(LAUNCHER_VARS) <= set(env.DECLARED)


def test_the_walk_finds_a_planted_read():
    assert names_read('x = os.environ.get("MS_LLM_NEW_THING", "")\nif "OTHER" in os.environ: pass') == \
        {"MS_LLM_NEW_THING", "OTHER"}


FOLDERS = [n for n, (kind, _) in env.DECLARED.items() if kind == "folder"]
COUNTS = [n for n, (kind, _) in env.DECLARED.items() if kind == "count"]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_folder_variable_at_a_file_an_unwritable_place_or_nothing(name, tmp_path, monkeypatch, capsys):
    default = str(tmp_path / "default")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for value, words in [(str(a_file), "is a file, not a folder"),
                         (str(a_file / "below"), "cannot be used as a folder (Not a directory)"),
                         ("/proc/ms_llm_cannot_be_here", "cannot be used as a folder")]:
        monkeypatch.setenv(name, value)
        with pytest.raises(UserError, match=re.escape(words)) as e:
            env.folder(name, default)
        assert name in str(e.value) and value in str(e.value) and "unset it" in str(e.value)
    monkeypatch.setenv(name, str(tmp_path / "new" / "deeper"))
    assert env.folder(name, default) == str(tmp_path / "new" / "deeper") and (tmp_path / "new" / "deeper").is_dir()
    monkeypatch.setenv(name, "  ")
    assert env.folder(name, default) == default
    assert env.folder(name, default) == default
    assert capsys.readouterr().err.count(f"{name} is set but empty; using {default}") == 1  # said once


@pytest.mark.parametrize("name", COUNTS)
def test_a_count_variable_that_is_not_a_whole_number(name, monkeypatch):
    for value in ["abc", "-1", "", "1.5", "nan"]:
        monkeypatch.setenv(name, value)
        with pytest.raises(UserError, match=f"{name}={re.escape(repr(value))} is not a whole number"):
            env.count(name)
    monkeypatch.setenv(name, " 3 ")
    assert env.count(name) == 3
    monkeypatch.delenv(name)
    assert env.count(name) is None


def test_train_with_the_cache_at_a_file_is_one_paragraph_and_writes_no_run(tmp_path, monkeypatch, capsys):
    from test_cli import refused_in_process

    a_file = tmp_path / "cache_file"
    a_file.write_text("")
    monkeypatch.setenv("MS_LLM_CACHE", str(a_file))
    refused_in_process(capsys, ["train", "--config", ROOT / "configs" / "shakespeare_char.yaml", "--run-dir",
                                tmp_path / "run"], "MS_LLM_CACHE=", "is a file, not a folder")
    assert not (tmp_path / "run").exists()

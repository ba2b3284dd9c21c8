"""The config reference (docs/configuration.md) generated from the schema, so the docs cannot drift.

`python -m ms_llm.config.reference` prints it; `python -m ms_llm.config.reference --update docs/configuration.md`
rewrites the block between the config-reference markers of that file (tests/test_docs.py fails until it is run after a
key is added, removed or re-documented)."""
import dataclasses
import json
import typing

from ms_llm.config.loader import type_name
from ms_llm.config.schema import Config

DOC = "docs/configuration.md"  # relative to the repository root


def reference_markdown():
    lines = []
    for section in dataclasses.fields(Config):
        cls = section.type
        hints = typing.get_type_hints(cls)
        lines += [f"**`{section.name}`**", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meaning = f.metadata.get("help", "")
            if f.metadata.get("choices"):
                meaning += f" ({' / '.join(f.metadata['choices'])})"
            lines.append(f"| `{f.name}` | {type_name(hints[f.name])} | `{json.dumps(default)}` | {meaning} |")
        lines.append("")
    return "\n".join(lines)


START, END = "<!-- config-reference:start", "<!-- config-reference:end -->"


def with_reference(text):
    """`text` (a Markdown document holding the config-reference markers) with the block between them regenerated."""
    head, rest = text.split(START, 1)
    marker_line, _ = rest.split("\n", 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}{marker_line}\n\n{reference_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        with open(sys.argv[2], encoding="utf-8") as f:
            text = f.read()
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            f.write(with_reference(text))
    elif sys.argv[1:]:
        sys.exit(f"usage: python -m ms_llm.config.reference [--update {DOC}]")
    else:
        print(reference_markdown())

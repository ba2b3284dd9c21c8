"""The config reference (README section) generated from the schema, so the docs cannot drift."""
import dataclasses
import json
import typing

from ms_llm.config.loader import type_name
from ms_llm.config.schema import Config


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


def readme_with_reference(readme_text):
    """README text with the block between the config-reference markers regenerated."""
    head, rest = readme_text.split(START, 1)
    marker_line, _ = rest.split("\n", 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}{marker_line}\n\n{reference_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--update", "README.md"]:
        text = open("README.md", encoding="utf-8").read()
        open("README.md", "w", encoding="utf-8").write(readme_with_reference(text))
    else:
        print(reference_markdown())

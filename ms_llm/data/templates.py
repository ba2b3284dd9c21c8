"""Chat templates: the Jinja template a tokenizer ships, rendered the way transformers' `apply_chat_template` renders
it, and the spans of the rendered text that the assistant wrote (what fine-tuning trains on).

Where the template comes from (`find_template`): `--chat-template FILE` when given; else, beside the tokenizer.json,
`chat_template.jinja` (what transformers 4.43+ and 5.x save) or the `chat_template` key of `tokenizer_config.json`
(a string, or a list of {name, template} of which "default" is taken, as transformers does). The special tokens
the template may use (`bos_token`, `eos_token`, ...) come from tokenizer_config.json, as transformers passes them.

Rendering (`ChatTemplate`): the environment of transformers 5.x (transformers/utils/chat_template_utils.py,
`_cached_compile_jinja_template`): jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, a `{% generation %}` block tag, a `tojson` filter that does not escape HTML and keeps
non-ASCII, and the globals `raise_exception` (a TemplateError with the template's message), `strftime_now`,
`dict` and `namespace`. tests/test_finetune_data.py renders the same conversations with transformers and compares
text and masks.

Assistant spans (`ChatTemplate.assistant_spans`):
  * a template with `{% generation %}` markers: the text each marked block rendered (transformers'
    `return_assistant_tokens_mask`);
  * otherwise, by rendering prefixes: for each assistant message i, its span starts where
    render(messages[:i], add_generation_prompt=True) ends (the assistant header is the prompt's) and ends where
    render(messages[:i+1]) ends (the end-of-turn token is the response's: the model must learn to stop). Each
    prefix must be a prefix of the full rendering; a template that renders earlier turns differently once later
    ones follow (one that drops past reasoning, say) is refused with the way out: add the markers.

jinja2 is needed only here (preprocessing chat data, `sample --chat`): it is imported when a template is compiled,
with a one-line install hint.
"""
import json
import os
import re
from contextlib import contextmanager

from ms_llm.errors import UserError
from ms_llm.fileio import read_user_json, read_user_text

MAX_TEMPLATE_BYTES = 4 * 1024 * 1024  # a chat template is a few KiB
MAX_TOKENIZER_CONFIG_BYTES = 64 * 1024 * 1024  # tokenizer_config.json: special tokens, at most a few MiB of them

JINJA_HINT = "pip install jinja2   (or: pip install -e \".[chat]\")"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path):
    """tokenizer_config.json, or None where there is none; a damaged one is a UserError naming it."""
    if not os.path.isfile(path):
        return None
    return read_user_json(path, "tokenizer config", limit=MAX_TOKENIZER_CONFIG_BYTES)


def find_template(tokenizer_path, override=None):
    """{"text", "source", "special_tokens"} for the tokenizer at `tokenizer_path` (its tokenizer.json), or for
    the template file `override`. Raises a UserError saying where it looked when there is none."""
    folder = os.path.dirname(os.path.abspath(tokenizer_path)) if tokenizer_path else None
    config = _read_json(os.path.join(folder, "tokenizer_config.json")) if folder else None
    config = config if isinstance(config, dict) else {}
    special = {k: _token_text(config.get(k)) for k in SPECIAL_TOKENS if _token_text(config.get(k))}
    if override:
        if not os.path.isfile(override):
            raise UserError(f"--chat-template '{override}' does not exist. Give a Jinja chat template file (for "
                            f"example the chat_template.jinja a model ships).")
        return {"text": read_user_text(override, "chat template", limit=MAX_TEMPLATE_BYTES),
                "source": os.path.abspath(override), "special_tokens": special}
    looked = []
    if folder:
        jinja_file = os.path.join(folder, "chat_template.jinja")
        looked.append(jinja_file)
        if os.path.isfile(jinja_file):
            return {"text": read_user_text(jinja_file, "chat template", limit=MAX_TEMPLATE_BYTES), "source": jinja_file,
                    "special_tokens": special}
        looked.append(os.path.join(folder, "tokenizer_config.json") + " (key chat_template)")
        text = config.get("chat_template")
        if isinstance(text, list):  # several named templates: transformers takes "default"
            named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
            text = named.get("default")
        if isinstance(text, str) and text.strip():
            return {"text": text, "source": os.path.join(folder, "tokenizer_config.json"), "special_tokens": special}
    what = f"tokenizer '{tokenizer_path}'" if tokenizer_path else "this tokenizer"
    where = ", ".join(looked) or "nothing: char, byte and SentencePiece tokenizers carry none"
    raise UserError(f"{what} has no chat template: chat and instruction data are rendered with the model's own "
                    f"template, and none was found (looked in: {where}). Use the tokenizer.json of a chat or instruct "
                    f"model with its tokenizer_config.json beside it, or pass --chat-template FILE with the Jinja "
                    f"template the model was trained with.")


def _environment():
    """transformers' chat-template environment (see the module docstring)."""
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UserError(f"rendering a chat template needs the optional 'jinja2' package. Install it: "
                        f"{JINJA_HINT}") from None
    from datetime import datetime

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}`: records the (start, end) of what the block rendered, measured in
        the output rendered so far (the template is rendered with generate(), block by block)."""
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(track_generation=self.track)
            self._tracking = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            out = caller()
            if self._tracking is not None:
                blocks, spans = self._tracking
                start = sum(len(b) for b in blocks)
                spans.append((start, start + len(out)))
            return out

        @contextmanager
        def track(self, blocks, spans):
            self._tracking = (blocks, spans)
            try:
                yield
            finally:
                self._tracking = None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace without underscore-prefixed attributes (the sandbox's rule, as transformers')."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            if any(isinstance(k, str) and k.startswith("_") for k in attrs):
                raise jinja2.exceptions.SecurityError("chat templates cannot store underscore-prefixed attributes")
            jinja2.utils.Namespace.__init__(self, attrs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = Namespace
    return env, jinja2


class TemplateProblem(ValueError):
    """A conversation the template refuses or renders inconsistently: a bad line, named by the caller."""


class ChatTemplate:
    def __init__(self, text, special_tokens=None, source=None):
        env, self._jinja = _environment()
        self.text, self.source = text, source
        self.special_tokens = dict(special_tokens or {})
        try:
            self.template = env.from_string(text)
        except self._jinja.exceptions.TemplateSyntaxError as e:
            raise UserError(f"the chat template {source or ''} does not parse as Jinja (line {e.lineno}: {e.message}). "
                            f"Fix it, or pass --chat-template FILE with the model's template.") from None
        self.env = env
        self.markers = bool(GENERATION_TAG.search(text))

    @classmethod
    def from_spec(cls, spec):
        return cls(spec["text"], spec.get("special_tokens"), spec.get("source"))

    def spec(self):
        return {"text": self.text, "source": self.source, "special_tokens": self.special_tokens,
                "spans": "generation markers" if self.markers else "rendered prefixes"}

    def render(self, messages, add_generation_prompt=False):
        try:
            return self.template.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except self._jinja.exceptions.TemplateError as e:
            raise TemplateProblem(f"the chat template refused it ({e})") from None

    def _render_tracked(self, messages):
        blocks, spans = [], []
        try:
            with self.env.track_generation(blocks, spans):
                for block in self.template.generate(messages=messages, tools=None, documents=None,
                                                    add_generation_prompt=False, **self.special_tokens):
                    blocks.append(block)
        except self._jinja.exceptions.TemplateError as e:
            raise TemplateProblem(f"the chat template refused it ({e})") from None
        return "".join(blocks), spans

    def assistant_spans(self, messages):
        """(rendered text, [(start, end)] character spans of the assistant's parts)."""
        if self.markers:
            return self._render_tracked(messages)
        full = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            prompt = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[: i + 1])
            if not (full.startswith(through) and through.startswith(prompt)):
                raise TemplateProblem(f"the chat template renders turn {i + 1} differently once later turns follow "
                                      f"(it changes earlier text: e.g. it drops past reasoning), so the assistant's "
                                      f"part cannot be found by rendering prefixes. Mark the assistant's part in the "
                                      f"template with {{% generation %}}...{{% endgeneration %}} (transformers' "
                                      f"convention), or keep one assistant turn per conversation")
            if len(through) > len(prompt):
                spans.append((len(prompt), len(through)))
        return full, spans


def token_mask(offsets, spans):
    """1 for every token whose (start, end) character offsets overlap a span, else 0: transformers' rule for
    `assistant_masks` (a token cut by a span's edge counts as the assistant's). Both lists are in order."""
    mask = [0] * len(offsets)
    k = 0
    for i, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[i] = 1
    return mask

"""Chat and instruction records → token ids and a loss mask (the worker side of `preprocess --format chat|instruction`).

A line of a chat JSONL is {"messages": [{"role": ..., "content": ...}, ...]} with at least one assistant message;
a line of an instruction JSONL is {"prompt": ..., "response": ...} (and an optional "system"), taken as the
conversation [system,] user: prompt, assistant: response; a line of a preference JSONL is {"prompt" | "messages",
"chosen", "rejected"} (`pair_of`), encoded as its two sequences one after the other (ms_llm/data/preference.py). Each conversation is rendered with the tokenizer's chat
template (templates.py), tokenized with character offsets, and its loss mask is 1 on the tokens of the assistant's
parts and 0 elsewhere. The first token of a conversation never counts: in a packed sample it would be predicted
from the end of the conversation before.

Runs in preprocessing's worker processes (workers.py): it imports neither MindSpore nor anything that does. A bad
record never raises here: it is listed (line, reason) and the main process decides (`--skip-bad`).
"""
import json
import os
import signal
from dataclasses import dataclass, field
from typing import List

import numpy as np

FORMATS = ("chat", "instruction", "preference")
MAX_REPORTED = 20


class BadRecord(ValueError):
    pass


def messages_of(record, fmt):
    """The conversation of one parsed JSONL record, or BadRecord naming what is missing."""
    if not isinstance(record, dict):
        raise BadRecord("is not a JSON object")
    if fmt == "instruction":
        for key in ("prompt", "response"):
            if not isinstance(record.get(key), str):
                raise BadRecord(f"has no string field '{key}' (an instruction record is {{\"prompt\": \"...\", "
                                f"\"response\": \"...\"}})")
        system = record.get("system")
        if system is not None and not isinstance(system, str):
            raise BadRecord("has a 'system' field that is not a string")
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": "user", "content": record["prompt"]},
                       {"role": "assistant", "content": record["response"]}]
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRecord("has no 'messages' list (a chat record is {\"messages\": [{\"role\": \"user\", \"content\": "
                        "\"...\"}, {\"role\": \"assistant\", \"content\": \"...\"}]})")
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRecord(f"message {i} has no string 'role'")
        if not isinstance(m.get("content"), str):
            raise BadRecord(f"message {i} ({m['role']}) has no string 'content'")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("has no assistant message: nothing to train on")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def encode_conversation(tokenizer, template, messages):
    """(ids int32, loss mask uint8) of one conversation; BadRecord when the template refuses it or it renders no
    assistant token."""
    from ms_llm.data.templates import TemplateProblem, token_mask

    try:
        text, spans = template.assistant_spans(messages)
    except TemplateProblem as e:
        raise BadRecord(str(e)) from None
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask = np.asarray(token_mask(offsets, spans), np.uint8)
    if len(mask):
        mask[0] = 0  # predicted from the previous conversation of a packed sample: never a target
    if not mask.any():
        raise BadRecord("renders no assistant token (empty responses?)")
    return np.asarray(ids, np.int32), mask


def as_messages(value, field):
    """A preference record's chosen/rejected (or prompt) value as a list of messages: a string is one message (the
    assistant's for a response), a dict one message, a list the messages themselves."""
    if isinstance(value, str):
        return [{"role": "assistant" if field in ("chosen", "rejected") else "user", "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadRecord(f"has no field '{field}' (a string or a list of messages; a preference record is "
                        f"{{\"prompt\": \"...\", \"chosen\": \"...\", \"rejected\": \"...\"}})")
    for i, m in enumerate(value, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRecord(f"field '{field}': message {i} has no string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def pair_of(record):
    """(prompt messages, chosen messages, rejected messages) of one preference record, or BadRecord naming the field
    that is missing or wrong. The prompt is `prompt` (a string: the user's turn; or a list of messages) or
    `messages`; chosen and rejected are strings (the assistant's reply) or assistant messages (TRL's conversational
    format)."""
    if not isinstance(record, dict):
        raise BadRecord("is not a JSON object")
    key = "prompt" if "prompt" in record else "messages"
    if key not in record:
        raise BadRecord("has no field 'prompt' (or 'messages'): a preference record is {\"prompt\": \"...\", "
                        "\"chosen\": \"...\", \"rejected\": \"...\"}")
    prompt = as_messages(record[key], key)
    system = record.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise BadRecord("has a 'system' field that is not a string")
        prompt = [{"role": "system", "content": system}] + prompt
    chosen, rejected = (as_messages(record.get(f), f) for f in ("chosen", "rejected"))
    for f, msgs in (("chosen", chosen), ("rejected", rejected)):
        if msgs[-1]["role"] != "assistant":
            raise BadRecord(f"field '{f}' does not end with an assistant message: nothing to score")
        if not msgs[-1]["content"]:
            raise BadRecord(f"field '{f}' is an empty response")
    if chosen == rejected:
        raise BadRecord("has 'chosen' equal to 'rejected': the pair prefers nothing (its loss is log 2 whatever the "
                        "model); drop the line or fix one of the two responses")
    return prompt, chosen, rejected


def encode_response(tokenizer, template, prompt, response):
    """(ids, mask) of prompt + response rendered with the template, the mask on the last assistant turn only (the
    response being scored; earlier assistant turns of the prompt are context)."""
    from ms_llm.data.templates import TemplateProblem, token_mask

    messages = prompt + response
    try:
        text, spans = template.assistant_spans(messages)
    except TemplateProblem as e:
        raise BadRecord(str(e)) from None
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask = np.asarray(token_mask(offsets, spans[-1:]), np.uint8)
    if len(mask):
        mask[0] = 0
    if not mask.any():
        raise BadRecord("renders no response token (empty responses?)")
    return np.asarray(ids, np.int32), mask


def encode_pair(tokenizer, template, record):
    """(ids, mask, length of the chosen sequence) of one preference record: the prompt + chosen sequence, then the
    prompt + rejected sequence, concatenated (one sample holds the pair: ms_llm/data/preference.py)."""
    prompt, chosen, rejected = pair_of(record)
    ci, cm = encode_response(tokenizer, template, prompt, chosen)
    ri, rm = encode_response(tokenizer, template, prompt, rejected)
    return np.concatenate([ci, ri]), np.concatenate([cm, rm]), len(ci)


@dataclass
class Conversations:
    """One chunk's conversations, concatenated: tokens and masks, with each conversation's length."""
    tokens: np.ndarray  # int32
    masks: np.ndarray  # uint8
    lengths: np.ndarray  # int64
    val: np.ndarray  # bool: the conversation belongs to the validation split (a hash of its line)
    lines: np.ndarray  # int64: the line of each conversation in its file
    bad: List[tuple] = field(default_factory=list)  # (line, byte offset or None, reason), at most MAX_REPORTED
    nbad: int = 0
    firsts: np.ndarray = None  # int64: the length of each record's first sequence (a preference pair's chosen one)


class ChatEncoder:
    def __init__(self, tokenizer, template, fmt, val_fraction):
        from ms_llm.data.encode import Encoder

        self.tok, self.template, self.fmt = tokenizer, template, fmt
        self.splitter = Encoder(None, val_fraction=val_fraction)  # the split rule of plain text: a hash

    def __call__(self, chunk):
        bad, toks, masks, lengths, val, lines, firsts = [], [], [], [], [], [], []
        for n, line in enumerate(chunk.data.split(b"\n")):
            where = chunk.first_line + n
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
                if self.fmt == "preference":
                    ids, mask, first = encode_pair(self.tok, self.template, json.loads(text))
                else:
                    ids, mask = encode_conversation(self.tok, self.template, messages_of(json.loads(text), self.fmt))
                    first = len(ids)
            except UnicodeDecodeError as e:
                bad.append((where, None, f"holds bytes {line[e.start:e.start + 4]!r} that are not UTF-8"))
                continue
            except ValueError as e:  # BadRecord, or json's error
                reason = str(e) if isinstance(e, BadRecord) else f"is not valid JSON ({getattr(e, 'msg', e)})"
                bad.append((where, None, reason))
                continue
            toks.append(ids)
            masks.append(mask)
            lengths.append(len(ids))
            val.append(self.splitter.is_val(text))
            lines.append(where)
            firsts.append(first)
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
        return Conversations(cat(toks, np.int32), cat(masks, np.uint8), np.asarray(lengths, np.int64),
                             np.asarray(val, bool), np.asarray(lines, np.int64), bad[:MAX_REPORTED], len(bad),
                             np.asarray(firsts, np.int64))


_encoder = None


def init_worker(tokenizer_spec, template_spec, fmt, val_fraction):
    """Pool initializer (see encode.init_worker): Ctrl-C is the main process's; one tokenizer thread per worker."""
    global _encoder
    from ms_llm.data.templates import ChatTemplate
    from ms_llm.data.tokenizers import from_spec
    from ms_llm.data.workers import in_worker

    if in_worker():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _encoder = ChatEncoder(from_spec(tokenizer_spec), ChatTemplate.from_spec(template_spec), fmt, val_fraction)


def encode_chunk(chunk):
    return _encoder(chunk)

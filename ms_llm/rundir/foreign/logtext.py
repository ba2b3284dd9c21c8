"""The text of other frameworks' logs as lines the readers can parse: colours and launcher prefixes taken off,
the rank each line came from, lines a terminal or a paste wrapped joined again, and cut lines marked.

What is taken off every physical line before a reader sees it:
  ANSI colour codes      torchtitan colours each field (\\x1b[31m ... \\x1b[39m)
  [rankK]: / [defaultK]:  torchrun's --tee / --log-dir prefixes (newer / older), which also give the rank
The rank of a line without a prefix is the one its file name says (msrun's worker_K.log, MindFormers' rank_K/,
torchrun's <attempt>/K/stdout.log), else None (one process, or a console that interleaved them).
"""
import os
import re
from collections import Counter
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:")
FILE_RANK = (re.compile(r"worker_(\d+)\.log$"), re.compile(r"(?:^|[/\\])rank_?(\d+)(?:[/\\]|\.)"),
             re.compile(r"[/\\](\d+)[/\\]std(?:out|err)\.log$"), re.compile(r"rank(\d+)[^/\\]*$"))
MAX_BYTES = 512 * 2 ** 20  # a larger file is read from its last 512 MiB (its end: the last steps, the error)
CUT = "cut lines (read up to their last whole field)"
JOIN_LOOKAHEAD = 16        # physical lines a wrapped record may continue over (a 600-character line at 40 columns)


@dataclass
class Line:
    file: str
    no: int            # 1-based line number of the record's first physical line
    rank: object       # int or None
    text: str
    last: bool = False  # the file's last line, without a newline after it: a write or a paste may have cut it


def file_rank(path):
    for pat in FILE_RANK:
        m = pat.search(path.replace("\\", "/") if "\\" in path else path)
        if m:
            return int(m.group(1))
    return None


def clean(text):
    """(rank or None, text without colours and launcher prefix)."""
    text = ANSI.sub("", text).replace("\x00", "")
    m = RANK_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end():]
    return None, text


def physical_lines(path, counts):
    """Line objects of one file, cleaned (no joining yet)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size > MAX_BYTES:
            f.seek(size - MAX_BYTES)
            counts["bytes left unread at the start of large files"] += size - MAX_BYTES
        data = f.read()
    text = data.decode("utf-8", errors="replace")
    ends_clean = text.endswith(("\n", "\r"))
    rows = text.splitlines()
    default = file_rank(path)
    out = []
    for i, raw in enumerate(rows, 1):
        rank, body = clean(raw)
        out.append(Line(path, i, default if rank is None else rank, body, last=i == len(rows) and not ends_clean))
    return out


def logical_lines(lines, starts, complete, begins_line, counts, ends=None):
    """Lines with wrapped records joined: a line that `starts` a record but is not `complete` takes the following
    lines of the same rank that begin no line of their own (no timestamp, no record, no prefix) until it is
    complete (`ends`: its known last field is there), up to JOIN_LOOKAHEAD of them; a line that ends a field but
    not with the known last one, and has no continuation, is whole (a field newer than the reader). One that stays incomplete is marked cut (its last field may be partial;
    the reader drops it), with the continuations it did find. Lines of other ranks interleaved by a console are passed over, not joined."""
    out, i, n = [], 0, len(lines)
    used = set()
    while i < n:
        if i in used:
            i += 1
            continue
        line = lines[i]
        ends = ends or complete  # `ends`: the record's known last field is there (stricter than `complete`)
        head = [] if starts(line.text) else record_head(lines, i, starts, begins_line)
        if head or (starts(line.text) and not ends(line.text)):
            text, taken, j = line.text + "".join(lines[k].text for k in head), list(head), i + 1 + len(head)
            while j < n and len(taken) < JOIN_LOOKAHEAD and not ends(text):
                nxt = lines[j]
                if nxt.rank != line.rank and nxt.rank is not None and line.rank is not None:
                    j += 1
                    continue
                if begins_line(nxt.text) or not nxt.text.strip():
                    break
                text += nxt.text
                taken.append(j)
                j += 1
            whole = complete(text)
            if taken:
                counts["wrapped lines joined"] += len(taken)
                used.update(taken)
            last = (lines[taken[-1]].last if taken else line.last) or not whole
            if last:
                counts[CUT] += 1
            out.append(Line(line.file, line.no, line.rank, text, last))
            i += 1
            continue
        if line.last and starts(line.text):
            counts[CUT] += 1  # the file ends inside it, without a newline: its last field is not trusted
        out.append(line)
        i += 1
    return out


def record_head(lines, i, starts, begins_line):
    """The indices of the continuation lines that make lines[i] the start of a record, when a wrap fell before
    the record's mark (' iteration' / '      10/ 300 |'); [] when lines[i] is no such start."""
    text, taken = lines[i].text, []
    for j in range(i + 1, min(len(lines), i + 1 + JOIN_LOOKAHEAD)):
        nxt = lines[j]
        if begins_line(nxt.text) or not nxt.text.strip() or (nxt.rank is not None and nxt.rank != lines[i].rank):
            return []
        text += nxt.text
        taken.append(j)
        if starts(text):
            return taken
    return []


LOG_START = re.compile(r"^\s*(?:\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|\[(?:INFO|WARNING|ERROR|DEBUG)\]|"
                       r"(?:INFO|WARNING|ERROR|DEBUG)\b|\[titan\]|\[rank\d+\]|\[Rank \d+\]|>|-{5,}|\w+:\d+:)")


def begins_any(text):
    """A line that starts on its own (a logger's timestamp or level, a launcher's mark): never a continuation."""
    return bool(LOG_START.match(text))


NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d*)?(?:[eE][-+]?\d+)?$")


def number(text):
    """A float from a log's rendering of one: thousands separators (1,234,567), numpy brackets ([1.2e-05],
    [ True]), nan/inf in any case. None when it is not a number."""
    t = text.strip().strip("[]()").strip().rstrip(",")
    low = t.lower()
    if low in ("nan", "-nan", "+nan"):
        return float("nan")
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return float("inf")
    if low in ("-inf", "-infinity"):
        return float("-inf")
    if not t or not NUMBER.match(t) or not any(c.isdigit() for c in t):
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return None


def new_counts():
    return Counter()

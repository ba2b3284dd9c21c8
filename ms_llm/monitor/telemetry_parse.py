"""Parsers for the device tools' outputs, kept apart from the sampler so they can be tested on recorded text.

Both return one dict per device with the same keys, so the report draws Ascend and GPU runs alike:
  id, name, temp_c, power_w, util_pct (AI Core on Ascend), mem_used_mb, mem_total_mb (HBM on Ascend when the
  chip has it), and on Ascend also health and mem_kind. A value the tool prints as NA / [N/A] is None.
"""
import re

# nvidia-smi --query-gpu fields, in this order (see `nvidia-smi --help-query-gpu`)
NVIDIA_FIELDS = ("index", "name", "temperature.gpu", "power.draw", "memory.used", "memory.total", "utilization.gpu")
NVIDIA_KEYS = ("id", "name", "temp_c", "power_w", "mem_used_mb", "mem_total_mb", "util_pct")
NVIDIA_COMMAND = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"]
NPU_COMMAND = ["npu-smi", "info"]

_TOKEN = re.compile(r"[^\s/]+\s*/\s*[^\s/]+|[^\s/]+")  # "1197 / 13553" is one token, "70.0" another


def number(text):
    """A float from the tool's text, None for NA, N/A, [Not Supported], - and the like."""
    try:
        return float(text.strip().strip("[]"))
    except (ValueError, AttributeError):
        return None


def parse_nvidia_smi(text):
    """Rows of `nvidia-smi --query-gpu=<NVIDIA_FIELDS> --format=csv,noheader,nounits`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(NVIDIA_FIELDS):  # a name holding commas: the numeric fields are the last five
            cells = [cells[0], ",".join(cells[1:len(cells) - 5]).strip()] + cells[-5:]
        if len(cells) != len(NVIDIA_FIELDS):
            raise ValueError(f"expected {len(NVIDIA_FIELDS)} comma-separated fields, got {len(cells)}: {line!r}")
        rec = dict(zip(NVIDIA_KEYS, cells))
        for k in NVIDIA_KEYS[2:]:
            rec[k] = number(rec[k])
        rec["id"] = int(rec["id"]) if rec["id"].isdigit() else rec["id"]
        out.append(rec)
    return out


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _columns(cell):
    return re.split(r"\s{2,}", cell.strip())


def _pair(token):
    """'1197 / 13553' → (1197.0, 13553.0); a single value → (value, None)."""
    if "/" in token:
        used, total = token.split("/", 1)
        return number(used), number(total)
    return number(token), None


def parse_npu_smi(text):
    """Chips of `npu-smi info`'s table: a header of two lines names the columns of the third cell, then each
    chip has two rows (NPU id, name, health, power, temperature, hugepages / chip id, bus id, AI Core,
    memory, HBM). The processes table that follows is ignored. Works for 910 (HBM column), 910B and 310P
    (no HBM column) layouts."""
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("|")]
    head1 = head2 = None
    rows = []
    for i, ln in enumerate(lines):
        cells = _cells(ln)
        if head1 is None:
            if len(cells) >= 3 and cells[0].startswith("NPU") and "Name" in cells[0]:
                head1 = _columns(cells[2])
                head2 = _columns(_cells(lines[i + 1])[2]) if i + 1 < len(lines) and len(_cells(lines[i + 1])) >= 3 \
                    else []
            continue
        if "Process" in ln:
            break  # the processes table that follows the chips
        if len(cells) >= 3 and re.match(r"^\d+(\s|$)", cells[0]):
            rows.append(cells)
    if head1 is None:
        raise ValueError("no 'NPU  Name | Health | Power(W) ...' header found in npu-smi output")
    out = []
    for top, bottom in zip(rows[0::2], rows[1::2]):
        npu, _, name = top[0].partition(" ")
        chip = bottom[0].split()[0]
        v1 = dict(zip(head1, _TOKEN.findall(top[2])))
        v2 = dict(zip(head2, _TOKEN.findall(bottom[2])))
        rec = {"id": int(npu) if chip == "0" else f"{npu}-{chip}", "name": name.strip(), "health": top[1],
               "power_w": number(v1.get("Power(W)", "")), "temp_c": number(v1.get("Temp(C)", "")),
               "util_pct": number(v2.get("AICore(%)", ""))}
        hbm = _pair(v2["HBM-Usage(MB)"]) if "HBM-Usage(MB)" in v2 else (None, None)
        ddr = _pair(v2["Memory-Usage(MB)"]) if "Memory-Usage(MB)" in v2 else (None, None)
        # 910-class chips report their device memory as HBM (Memory-Usage is the host-side DDR, often 0 / 0);
        # 310P has no HBM column and its device memory is Memory-Usage
        used, total, kind = (*hbm, "HBM") if hbm[1] else (*ddr, "DDR")
        rec.update(mem_used_mb=used, mem_total_mb=total, mem_kind=kind)
        out.append(rec)
    if not out:
        raise ValueError("npu-smi output has a header but no chip rows")
    return out

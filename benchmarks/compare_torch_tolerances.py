"""Where compare-torch's tolerances come from (ms_llm/debug/compare_torch.py, TOLERANCES; docs/debugging.md).

For each family (gpt2, llama), size and seed: a random transformers model (its own initialisation, seeded), saved
with save_pretrained, compared by `ms-llm debug compare-torch` in float32 and float16 on a random batch of the same
seed. Per row kind (forward, loss, gradient, weight) the largest max relative error over every row of every run
is the measurement. The rule:

    band[kind]   = MARGIN (10) x the largest float32 error, rounded up to one significant digit: what two float32
                   implementations of the same model drift apart, with room for larger models (from the tiny to
                   the small size, 16x the parameters, the largest error grew about 2x)
    units[kind]  = the largest float16 error in units of float16's unit roundoff 2^-11: how many roundings of its
                   own dtype a half-precision comparison accumulates
    tolerance[float32][kind] = band[kind]
    tolerance[dtype][kind]   = band[kind] + MARGIN x units[kind] x unit roundoff of dtype, for the kinds computed
                               in the compute dtype (forward, loss, gradient); bfloat16 (2^-8) takes float16's
                               count of units, as bfloat16 cannot run on CPU (MindSpore's CPU MatMul has no
                               bfloat16 kernel)
    tolerance[dtype][weight] = band[weight]: AdamW updates float32 master weights, and both optimizers are given
                               the same gradients

  python benchmarks/compare_torch_tolerances.py --out /tmp/ct_tol [--mode pynative]

Finished comparisons are reused when the command is run again with the same --out.
"""
import argparse
import contextlib
import io
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZES = {  # name -> (layers, hidden, heads, kv heads, llama ffn, vocab, tokens per sample)
    "tiny": (2, 64, 4, 2, 128, 128, 32),  # the tests' models
    "small": (4, 256, 8, 4, 512, 512, 64),
}
SEEDS = (0, 1, 2, 3, 4)
MARGIN = 10
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
KINDS = ("forward", "loss", "gradient", "weight")
IN_COMPUTE_DTYPE = ("forward", "loss", "gradient")


def make_model(family, size, seed, folder):
    """A random transformers model of `family` and `size`, initialised by transformers under `seed`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    layers, hidden, heads, kv, ffn, vocab, t = SIZES[size]
    torch.manual_seed(seed)
    if family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=4 * t,
                                           vocab_size=vocab, bos_token_id=0, eos_token_id=0))
    else:
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                             num_key_value_heads=kv, intermediate_size=ffn,
                                             max_position_embeddings=4 * t, vocab_size=vocab, bos_token_id=0,
                                             eos_token_id=0))
    model.save_pretrained(folder)


def run(out, family, size, seed, dtype, mode="graph"):
    """The compare.json of one comparison (made, or reused from an earlier invocation)."""
    hf_dir = os.path.join(out, f"{family}-{size}-seed{seed}", "hf")
    result = os.path.join(out, f"{family}-{size}-seed{seed}", dtype)
    if not os.path.isfile(os.path.join(result, "compare.json")):
        if not os.path.isfile(os.path.join(hf_dir, "config.json")):
            make_model(family, size, seed, hf_dir)
        from ms_llm.cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            main(["debug", "compare-torch", "--hf", hf_dir, "--seed", str(seed), "--seq-length",
                  str(SIZES[size][-1]), "--compute-dtype", dtype, "--output-dir", result,
                  "--set", f"context.mode={mode}"])
    with open(os.path.join(result, "compare.json"), encoding="utf-8") as f:
        return json.load(f)


def round_up(x):
    """x rounded up to one significant digit (7.3e-6 -> 8e-6)."""
    e = math.floor(math.log10(x))
    return math.ceil(x / 10 ** e - 1e-9) * 10 ** e


def derive(worst32, worst16):
    band = {k: float(f"{round_up(worst32[k] * MARGIN):.0e}") for k in KINDS}
    table = {"float32": dict(band)}
    for dtype in ("float16", "bfloat16"):
        units = {k: worst16[k] / UNIT_ROUNDOFF["float16"] for k in KINDS}
        table[dtype] = {k: float(f"{round_up(band[k] + MARGIN * units[k] * UNIT_ROUNDOFF[dtype]):.0e}")
                        if k in IN_COMPUTE_DTYPE else band[k] for k in KINDS}
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="working folder (models, comparisons); reused when rerun")
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph",
                        help="the training step's mode (on CPU both gave identical rows; pynative skips the compile)")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    worst = {d: {k: (0.0, "") for k in KINDS} for d in ("float32", "float16")}
    for dtype in ("float32", "float16"):
        for family in ("gpt2", "llama"):
            for size in SIZES:
                per_run = {k: 0.0 for k in KINDS}
                for seed in SEEDS[: args.seeds]:
                    r = run(args.out, family, size, seed, dtype, args.mode)
                    for row in r["rows"]:
                        v = float(row["max_rel"])
                        per_run[row["kind"]] = max(per_run[row["kind"]], v)
                        if v > worst[dtype][row["kind"]][0]:
                            worst[dtype][row["kind"]] = (v, f"{family} {size} seed {seed}: {row['ours']}")
                print(f"{dtype:<8} {family:<6} {size:<6} largest max rel over {args.seeds} seeds: "
                      + ", ".join(f"{k} {per_run[k]:.2g}" for k in KINDS), flush=True)
    table = derive({k: worst["float32"][k][0] for k in KINDS}, {k: worst["float16"][k][0] for k in KINDS})
    print("\nlargest error per kind (where):")
    for dtype in worst:
        for k in KINDS:
            v, where = worst[dtype][k]
            print(f"  {dtype:<8} {k:<9} {v:.3g}  ({where})")
    print("\nfloat16 errors in units of float16's unit roundoff: "
          + ", ".join(f"{k} {worst['float16'][k][0] / UNIT_ROUNDOFF['float16']:.2f}" for k in KINDS))
    print(f"derived tolerances (band: {MARGIN} x the largest float32 error, rounded up; half precision: band + "
          f"{MARGIN} x float16's units x the dtype's unit roundoff):")
    for dtype, row in table.items():
        print(f"  {dtype:<8} " + ", ".join(f"{k} {row[k]:.0e}" for k in KINDS))
    from ms_llm.debug.compare_torch import TOLERANCES

    print(f"TOLERANCES in ms_llm/debug/compare_torch.py {'match' if TOLERANCES == table else 'DIFFER: update them'}")
    print(json.dumps(table))


if __name__ == "__main__":
    main()

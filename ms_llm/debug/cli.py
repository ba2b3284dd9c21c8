"""The debugging commands: `doctor`, `debug overfit|nan|dump|compare-torch`, `compare` (`debug lr-find|ladder` are
ms_llm/tune's, added to the same group by ms_llm/cli.py)."""
import glob
import json
import os

import numpy as np

from ms_llm.errors import UserError
from ms_llm.config.cli_args import add_config_arguments, add_set_argument


def cmd_doctor(args):
    from ms_llm.debug.doctor import doctor

    return doctor(args.run_dir, smoke=not args.no_smoke)


def cmd_overfit(args):
    from ms_llm.config import load_config
    from ms_llm.debug.overfit import format_report, overfit

    if args.samples <= 0 or args.steps <= 0:
        raise UserError(f"--samples = {args.samples} and --steps = {args.steps} must be positive.")
    r = overfit(load_config(args.config, args.overrides), args.samples, args.steps, args.threshold)
    print(format_report(r))
    return 0 if r["passed"] else 1


def cmd_nan(args):
    """Replay a saved non-finite step (<run>/nan/step_<n>) or the step after checkpoint --step with the hunter."""
    from ms_llm.debug.nan_hunter import format_report, hunt
    from ms_llm.train.setup.context import setup_context
    from ms_llm.train.setup.run_model import find_run_checkpoint, load_run_config, load_run_model

    cfg = load_run_config(args.run_dir, args.overrides)
    setup_context(cfg.context)
    saved = sorted(glob.glob(os.path.join(args.run_dir, "nan", "step_*", "rank_0")),
                   key=lambda p: int(p.split("step_")[1].split(os.sep)[0]))
    if args.step is not None:
        saved = [p for p in saved if f"step_{args.step}{os.sep}" in p + os.sep]
    if saved and os.path.isfile(os.path.join(saved[-1], "state.ckpt")):
        where = saved[-1]
        _, model, _ = load_run_model(args.run_dir, overrides=args.overrides,
                                     checkpoint=os.path.join(where, "state.ckpt"))
        ids = np.load(os.path.join(where, "batch.npy"))
        ids = ids.reshape(-1, ids.shape[-1])
        print(f"replaying the saved non-finite step in {where}")
    elif args.step is not None:
        path, manifest = find_run_checkpoint(args.run_dir, args.step)
        _, model, _ = load_run_model(args.run_dir, overrides=args.overrides, checkpoint=path)
        ids = step_batch(cfg, manifest["consumed_samples"])
        where = os.path.join(args.run_dir, "nan", f"replay_step_{args.step + 1}")
        print(f"replaying step {args.step + 1} from checkpoint step {args.step}")
    else:
        raise UserError(f"'{args.run_dir}' has no saved non-finite step (run with monitor.nan_check: true) — pass "
                        f"--step N to replay the step after checkpoint N.")
    report = hunt(model, ids, cfg.precision.compute_dtype)
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    print(format_report(report))
    return 0


def step_batch(cfg, consumed):
    """The global batch that follows `consumed` samples, as one array (the same whatever the rank count)."""
    from ms_llm.data.loader import TrainBatches
    from ms_llm.data.manifest import load_manifest

    manifest = load_manifest(cfg.data.dataset_dir, blend=cfg.data.blend)
    it = TrainBatches(cfg.data.dataset_dir, manifest, "train", cfg.train.global_batch_size, 1, 0, cfg.train.seed,
                      cfg.model.seq_length, consumed=consumed)
    return next(it).asnumpy()


def cmd_dump(args):
    from ms_llm.debug.compare import make_dump

    make_dump(args.run_dir, args.output, args.step, args.overrides)


def cmd_compare(args):
    from ms_llm.debug.compare import compare, format_comparison

    paths = []
    for p in (args.a, args.b):
        if os.path.isfile(os.path.join(p, "index.json")):
            paths.append(p)
            continue
        dumps = sorted(glob.glob(os.path.join(p, "dumps", "*", "index.json")), key=os.path.getmtime)
        if not dumps:
            raise UserError(f"'{p}' is neither a dump (index.json) nor a run with dumps/: make one with "
                            f"`ms-llm debug dump --run-dir RUN --output RUN/dumps/NAME`.")
        paths.append(os.path.dirname(dumps[-1]))
    r = compare(paths[0], paths[1], args.rtol, args.min_cosine)
    print(json.dumps({k: v for k, v in r.items() if k != "rows"}, default=str) if args.json else format_comparison(r))
    return 0


def cmd_compare_torch(args):
    from ms_llm.debug.compare_torch import compare_torch, format_result, jsonable

    r = compare_torch(args.hf, args.batch_size, args.seq_length, args.seed, args.data, args.compute_dtype,
                      args.output_dir, args.reference_dump, args.name_map, args.config, args.overrides)
    print(format_result(r), flush=True)
    if args.json:
        print(json.dumps(jsonable({k: v for k, v in r.items()})), flush=True)
    return r["exit_code"]


def add_parsers(sub):
    p = sub.add_parser("doctor", help="environment check: versions, device, env vars, disk, 20-step smoke train")
    p.add_argument("--run-dir", default="runs", help="where runs will be written (disk space check)")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke train")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("debug", help="divergence toolkit: overfit, nan, dump, compare-torch, lr-find, ladder")
    dsub = p.add_subparsers(dest="debug_command", metavar="tool", parser_class=type(p))
    dsub.required = True
    q = dsub.add_parser("overfit", help="can the model memorise a few samples? (bugs vs data)")
    add_config_arguments(q)
    q.add_argument("--samples", type=int, default=32)
    q.add_argument("--steps", type=int, default=300)
    q.add_argument("--threshold", type=float, default=0.1, help="pass below this fraction of the initial loss")
    q.set_defaults(func=cmd_overfit)
    q = dsub.add_parser("nan", help="find the first module / gradient that went non-finite, and why")
    q.add_argument("--run-dir", required=True)
    q.add_argument("--step", type=int, help="a saved NaN step, or the checkpoint whose next step to replay")
    add_set_argument(q)
    q.set_defaults(func=cmd_nan)
    q = dsub.add_parser("compare-torch", help="a Hugging Face model in ms_llm against transformers/PyTorch: every "
                                              "module's output, gradient and one AdamW step; exit 1 over tolerance")
    q.add_argument("--hf", required=True, metavar="DIR", help="Hugging Face model folder (config.json + safetensors)")
    q.add_argument("--batch-size", type=int, default=2)
    q.add_argument("--seq-length", type=int, help="tokens per sample (default: 32, or the dataset's, capped by the "
                                                  "model's positions)")
    q.add_argument("--seed", type=int, default=0, help="seed of the random token batch")
    q.add_argument("--data", metavar="DATASET_DIR", help="take the first validation batch of this dataset instead")
    q.add_argument("--compute-dtype", choices=("float32", "float16", "bfloat16"),
                   help="ms_llm's compute dtype (default: the config's precision.compute_dtype); PyTorch stays float32")
    q.add_argument("--output-dir", metavar="O", help="where compare.json, compare.html, batch.npy and the reference "
                                                     "dump go (default: compare_torch/<model>-<dtype>-<time>)")
    q.add_argument("--json", action="store_true", help="print the result as one JSON object as the last line")
    q.add_argument("--reference-dump", metavar="D", help="compare this dump (ms_llm.interop.torch_dump.dump_module) "
                                                         "instead of running transformers")
    q.add_argument("--name-map", metavar="M.yaml", help="with --reference-dump: 'their name: ms_llm name' lines")
    add_config_arguments(q, required=False, help="training config whose train/precision/context sections to use (the "
                                                 "model comes from --hf)",
                         set_help="repeatable, e.g. --set train.weight_decay=0.01: the optimizer step's settings")
    q.set_defaults(func=cmd_compare_torch)
    q = dsub.add_parser("dump", help="per-module outputs and gradients on a fixed batch, for `ms-llm compare`")
    q.add_argument("--run-dir", required=True)
    q.add_argument("--step", type=int, help="checkpoint step (default: newest)")
    q.add_argument("--output", required=True)
    add_set_argument(q, help="e.g. precision.compute_dtype=float16 to dump the same weights in another precision")
    q.set_defaults(func=cmd_dump)

    p = sub.add_parser("compare", help="layer-by-layer comparison of two dumps (or runs with dumps/)")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-2, help="max error relative to B's largest magnitude")
    p.add_argument("--min-cosine", type=float, default=0.999)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)
    return dsub  # the `debug` group: ms_llm/tune adds lr-find and ladder to it


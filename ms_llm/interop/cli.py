"""The `convert` command: Hugging Face and MindFormers checkpoints and configs <-> ms_llm, and resharding a
checkpoint across tensor-parallel layouts (`--split` / `--merge`). `add_parsers(subparsers)` registers it."""
import os

from ms_llm.config.cli_args import add_config_arguments
from ms_llm.errors import UserError


def cmd_convert(args):
    from ms_llm.interop import huggingface

    modes = [m for m in ("from_hf", "to_hf", "split", "merge", "from_mindformers_config", "from_mindformers",
                         "to_mindformers", "merge_lora") if getattr(args, m)]
    if len(modes) != 1:
        raise UserError("convert needs exactly one of --from-hf HF_DIR, --to-hf CHECKPOINT, --split CHECKPOINT, "
                        "--merge SHARD_DIR, --from-mindformers-config YAML, --from-mindformers CKPT, "
                        "--to-mindformers CHECKPOINT or --merge-lora CHECKPOINT.")
    if args.merge_lora:  # a LoRA run's adapters folded into its base weights (docs/finetuning.md)
        from ms_llm.interop.lora_merge import merge_lora_checkpoint

        merge_lora_checkpoint(args.merge_lora, args.output, args.format)
        return None
    if args.split or args.merge:
        return reshard(args)
    if args.from_mindformers_config:
        from ms_llm.interop.mindformers.config import convert_config

        convert_config(args.from_mindformers_config, args.output, args.samples, args.devices)
        return None
    if args.from_mindformers or args.to_mindformers:  # Llama/Qwen2.5 checkpoints, docs/from_mindformers.md
        from ms_llm.interop.mindformers import ckpt as mindformers_ckpt

        if args.from_mindformers:
            mindformers_ckpt.from_mindformers(args.from_mindformers, args.config, args.output, args.fused_layout,
                                              args.strategy, args.format)
        else:
            mindformers_ckpt.to_mindformers(args.to_mindformers, args.config, args.output, args.dtype,
                                            args.fused_layout)
        return None
    if args.from_hf:
        if not os.path.isdir(args.from_hf):
            raise UserError(f"--from-hf '{args.from_hf}' is not a folder. Give a Hugging Face model folder.")
        huggingface.from_hf(args.from_hf, args.output, args.format)
    else:
        if not os.path.isfile(args.to_hf):
            raise UserError(f"--to-hf '{args.to_hf}' does not exist. Give a checkpoint file (.ckpt/.safetensors).")
        config = args.config or os.path.join(os.path.dirname(os.path.abspath(args.to_hf)), "config.yaml")
        huggingface.to_hf(args.to_hf, config, args.output)


def reshard(args):
    """--split a full checkpoint into rank_<r>/ shards for the layout of --config (+ --set), or --merge them."""
    from ms_llm.checkpoint import store
    from ms_llm.config import load_config
    from ms_llm.parallel import reshard as rs
    from ms_llm.parallel.layout import build_plan

    if not args.config:
        raise UserError("--split/--merge need --config (the model and its parallel_config) and --devices.")
    cfg = load_config(args.config, args.overrides)
    pc = cfg.parallel_config
    devices = args.devices or (pc.data_parallel or 1) * pc.model_parallel * pc.pipeline_stage
    plan = build_plan(cfg, devices, check_batch=False)
    if args.split:
        if not os.path.isfile(args.split):
            raise UserError(f"--split '{args.split}' does not exist. Give a full checkpoint file.")
        for rank, arrays in rs.split(store.read_tensors(args.split), plan).items():
            os.makedirs(os.path.join(args.output, f"rank_{rank}"), exist_ok=True)
            store.write_tensors(os.path.join(args.output, f"rank_{rank}", "model.ckpt"), arrays, "ckpt")
        print(f"split for data {plan.dp} x model {plan.mp}: {devices} shards in {args.output}/rank_*/model.ckpt")
    else:
        shards = {}
        for rank in range(devices):
            path = os.path.join(args.merge, f"rank_{rank}", "model.ckpt")
            if not os.path.isfile(path):
                raise UserError(f"--merge: '{path}' is missing; all {devices} ranks' shards are needed.")
            shards[rank] = store.read_tensors(path)
        store.write_tensors(args.output, rs.merge(shards, plan), "ckpt")
        print(f"merged {devices} shards → {args.output}")


def add_parsers(subparsers):
    p = subparsers.add_parser("convert", help="Hugging Face GPT-2/Llama/Qwen2.5/Qwen3/Mistral and MindFormers "
                                       "Llama/Qwen2.5 checkpoints and configs <-> ms_llm; reshard across layouts")
    # exactly one mode per call; argparse refuses none or two (exit 2), and tests/test_docs.py requires each in the
    # README's command table
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--from-hf", metavar="HF_DIR", help="a Hugging Face model folder (config.json + *.safetensors)")
    mode.add_argument("--to-hf", metavar="CHECKPOINT", help="an ms_llm .ckpt/.safetensors file (weights)")
    mode.add_argument("--split", metavar="CHECKPOINT", help="full checkpoint → per-rank shards for --config's layout")
    mode.add_argument("--merge", metavar="SHARD_DIR", help="rank_<r>/model.ckpt shards → one full checkpoint")
    p.add_argument("--devices", type=int, help="with --split/--merge: ranks of the layout; with "
                                               "--from-mindformers-config: ranks of a use_parallel: false run")
    add_config_arguments(p, required=False, help="with --to-hf/--to-mindformers: the model's config.yaml (default: "
                                                 "next to the checkpoint); with --from-mindformers: the model's config "
                                                 "(ours or the MindFormers YAML); with --split/--merge: the config "
                                                 "whose parallel_config gives the layout")
    p.add_argument("--output", required=True, help="folder to write (with --from-mindformers-config: the YAML file)")
    p.add_argument("--format", choices=("ckpt", "safetensors"), default="ckpt",
                   help="with --from-hf / --from-mindformers / --merge-lora: the file format written")
    mode.add_argument("--from-mindformers-config", metavar="YAML",
                      help="a MindFormers Llama YAML → an ms_llm config (--output C.yaml); prints what became of "
                           "every key")
    p.add_argument("--samples", type=int, help="with --from-mindformers-config: training samples in the dataset, to "
                                               "turn runner_config.epochs into train.max_steps (default: counted when "
                                               "train_dataset's dataset_dir is readable)")
    mode.add_argument("--from-mindformers", metavar="CKPT",
                      help="a MindFormers Llama checkpoint (.ckpt/.safetensors, or a folder of rank_<r>/ shards with "
                           "--strategy) → DIR/model.ckpt + config.yaml; needs --config")
    mode.add_argument("--to-mindformers", metavar="CHECKPOINT",
                      help="an ms_llm checkpoint → MindFormers names in DIR/rank_0/model.ckpt")
    mode.add_argument("--merge-lora", metavar="CHECKPOINT",
                      help="a checkpoint of a finetune.lora run → DIR/model.ckpt with the adapters merged into the "
                           "base weights (+ config.yaml), ready for --to-hf")
    p.add_argument("--strategy", metavar="PATH", help="with --from-mindformers DIR: the strategy file of the sharded "
                                                      "run (or the folder of per-stage files)")
    p.add_argument("--fused-layout", choices=("grouped", "concatenated"),
                   help="row order of fused w_qkv / w_gate_hidden: grouped (MindFormers >= 1.4) or concatenated "
                        "(<= 1.3); needed to read fused tensors; with --to-mindformers, writes fused tensors")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                   help="with --to-mindformers: tensor dtype (default: the dtypes of the checkpoint converted from "
                        "MindFormers, else float32)")
    p.set_defaults(func=cmd_convert)

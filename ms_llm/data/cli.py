"""The data commands: `ms-llm tokenizer train`, `ms-llm data info`, `ms-llm data adopt`."""
from ms_llm.config.cli_args import add_config_arguments


def cmd_tokenizer_train(args):
    from ms_llm.data.train_tokenizer import train_tokenizer

    train_tokenizer(args.input, args.vocab_size, args.output, args.text_field, args.min_frequency, args.overwrite,
                    args.skip_bad)


def cmd_data_info(args):
    from ms_llm.data.info import info

    cfg = None
    if args.config:
        from ms_llm.config import load_config

        cfg = load_config(args.config, args.overrides)
    if args.show_sample is not None:  # a fine-tuning sample with its loss mask (docs/finetuning.md)
        from ms_llm.data.chat_pack import sample_lines
        from ms_llm.data.manifest import load_manifest

        for line in sample_lines(args.dataset_dir, load_manifest(args.dataset_dir, verify=False), args.show_sample):
            print(line)
        return
    for line in info(args.dataset_dir, cfg):
        print(line)


def cmd_data_adopt(args):
    from ms_llm.data.adopt import adopt

    if args.seq_length <= 0:
        from ms_llm.errors import UserError

        raise UserError(f"--seq-length = {args.seq_length} must be a positive integer.")
    adopt(args.dataset_dir, args.tokenizer, args.seq_length, args.val_fraction, args.overwrite)


def add_parsers(sub):
    p = sub.add_parser("tokenizer", help="tokenizer tools: train a byte-level BPE tokenizer.json on a corpus")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="command", parser_class=type(p))
    tsub.required = True
    t = tsub.add_parser("train", help="byte-level BPE tokenizer.json from text/JSONL files (needs `tokenizers`)")
    t.add_argument("--input", nargs="+", required=True, help="files, folders or globs of .txt / .jsonl / .jsonl.gz")
    t.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary, e.g. 32000")
    t.add_argument("--output", required=True, help="tokenizer.json to write")
    t.add_argument("--text-field", default="text", help="JSONL key holding the text (default: text)")
    t.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often (default 2)")
    t.add_argument("--skip-bad", action="store_true", help="skip invalid JSON lines instead of stopping")
    t.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    t.set_defaults(func=cmd_tokenizer_train)

    p = sub.add_parser("data", help="dataset tools: info (statistics, epochs of a run), adopt (existing MindRecords)")
    dsub = p.add_subparsers(dest="data_command", metavar="command", parser_class=type(p))
    dsub.required = True
    d = dsub.add_parser("info", help="documents, tokens, samples, length histogram, unigram entropy; epochs of a run")
    d.add_argument("dataset_dir")
    add_config_arguments(d, required=False, help="a training config: how many epochs its run covers")
    d.add_argument("--show-sample", type=int, metavar="N", help="chat/instruction data: print training sample N with "
                                                              "its loss mask and conversation boundaries")
    d.set_defaults(func=cmd_data_info)
    d = dsub.add_parser("adopt", help="write a manifest for MindRecord files with an input_ids column (e.g. "
                                      "MindFormers'); the data files are not modified")
    d.add_argument("dataset_dir")
    d.add_argument("--tokenizer", required=True, help="the tokenizer.json / tokenizer.model (or byte) the files "
                                                      "were made with")
    d.add_argument("--seq-length", type=int, required=True, help="rows hold seq_length + 1 tokens")
    d.add_argument("--val-fraction", type=float, default=0.0,
                   help="hold out the last share of the samples for validation (default 0: no validation)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing manifest.json")
    d.set_defaults(func=cmd_data_adopt)

"""The `--set SECTION.KEY=VALUE` argument every command that reads a config takes, declared once."""

SET_HELP = "override a config value (repeatable), e.g. --set train.max_steps=300"


def add_set_argument(parser, help=SET_HELP):
    """`--set` (repeatable) into `args.overrides`, applied by `ms_llm.config.load_config(path, args.overrides)`."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=help)

"""`--config FILE` and `--set SECTION.KEY=VALUE`: the arguments every command that reads a config takes, declared once."""

SET_HELP = "override a config value (repeatable), e.g. --set train.max_steps=300"


def add_set_argument(parser, help=SET_HELP):
    """`--set` (repeatable) into `args.overrides`, applied by `ms_llm.config.load_config(path, args.overrides)`."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=help)


CONFIG_HELP = "YAML config, e.g. configs/shakespeare_char.yaml"


def add_config_arguments(parser, required=True, help=CONFIG_HELP, set_help=SET_HELP):
    """`--config` (into `args.config`) and `--set` (into `args.overrides`): `load_config(args.config, args.overrides)`."""
    parser.add_argument("--config", required=required, help=help)
    add_set_argument(parser, set_help)

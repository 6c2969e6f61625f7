"""An analysis' command-line flags, generated from its declaration (diagnostics.declare.Option).

Each declared option with a flag becomes one argparse argument: its type, choices, bounds and
help (with the default) come from the declaration, so the CLI never restates a default. Only the
options a user actually passes go into the options dict; the declaration fills in the rest when
the job is validated. Any declared option can also be set with ``--option key=value`` (the value
parsed as JSON); an unknown key is refused by the declaration with the list of valid ones.
"""

from __future__ import annotations

import argparse
import json

from diagnostics.cli.model_args import UsageError
from diagnostics.declare import Analysis, Option, OptionError


def _typed(option: Option):
    """An argparse type function that checks one value against the declaration."""

    def parse(text: str):
        value = text
        if option.kind in ("list", "dict"):
            try:
                value = json.loads(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not JSON") from None
        try:
            return option.validate(value)
        except OptionError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"option {option.key}: ")) from None

    parse.__name__ = option.kind  # argparse names the type in its messages
    return parse


def dest(option: Option) -> str:
    return "opt_" + option.key


def add_option(group, option: Option) -> None:
    """One declared option as a flag of ``group`` (nothing when it is declared without a flag)."""
    flag = option.cli_flag
    if flag is None:
        return
    help_ = f"{option.help} (default {option.describe_default()})".replace("%", "%%")
    if option.kind == "bool":
        if option.flag is None and option.default:  # on by default: the flag turns it off
            flag = "--no-" + option.key.replace("_", "-")
        group.add_argument(flag, dest=dest(option), action="store_const", const=not option.default, default=None,
                           help=help_)
    elif option.kind == "multi":
        group.add_argument(flag, dest=dest(option), action="append", choices=option.choices, default=None,
                           help=help_ + "; repeat for several")
    elif option.kind == "choice":
        group.add_argument(flag, dest=dest(option), choices=option.choices, default=None, help=help_)
    else:
        metavar = {"int": "N", "float": "X", "path": "PATH", "list": "JSON", "dict": "JSON"}.get(option.kind, "TEXT")
        group.add_argument(flag, dest=dest(option), type=_typed(option), default=None, metavar=metavar,
                           help=help_)


def add_options(parser, analysis: Analysis) -> None:
    """Every flagged option of ``analysis`` in a group of its own, and ``--option KEY=VALUE``."""
    flagged = [o for o in analysis.options if o.cli_flag]
    if flagged:
        group = parser.add_argument_group(f"{analysis.name} options")
        for o in flagged:
            add_option(group, o)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", dest="extra_options",
                        help="any other option of the analysis; VALUE is parsed as JSON when it can be (e.g. "
                             "--option record_shapes=false). Known keys: "
                             + (", ".join(analysis.option_keys) or "none"))


def collect_options(analysis: Analysis, args) -> dict:
    """The options the user set (flags, then --option pairs), checked against the declaration."""
    out = {o.key: getattr(args, dest(o)) for o in analysis.options if getattr(args, dest(o), None) is not None}
    extra = parse_option_pairs(getattr(args, "extra_options", None) or [])
    out.update(extra)
    try:
        analysis.validate(out)
    except OptionError as e:
        # A key that is a flag's name for another key: say which flag sets what (--steps sets 'active').
        flags = {o.cli_flag.lstrip("-").replace("-", "_"): o for o in analysis.options if o.cli_flag}
        hints = [f"{flags[k].cli_flag} sets {flags[k].key!r}" for k in extra
                 if k not in analysis.option_keys and k in flags and flags[k].key != k]
        raise UsageError(str(e) + (f" ({'; '.join(hints)})" if hints else "")) from None
    return out


def parse_option_pairs(pairs: list[str]) -> dict:
    """['steps=3', 'mode=train', 'sizes=[1,2]'] -> {'steps': 3, 'mode': 'train', 'sizes': [1, 2]}."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"bad --option {pair!r}: write KEY=VALUE, e.g. --option steps=3")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a bare word: the string itself
    return out


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be positive")
    return v


def score(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"{v:g} is not a score between 0 and 100")
    return v

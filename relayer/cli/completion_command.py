"""``relayer completion bash|zsh|fish``: a shell completion script, printed.

The script is generated from the command's own argparse parser, so it always knows every
command, option and choice of this version; store names are asked of ``relayer completion
--list-stores`` when a STORE is being completed (with the ``--config`` already typed), so they
follow the configuration. zsh runs the bash script through ``bashcompinit``.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

from relayer.cli.common import EXIT_OK, Context
from relayer.errors import UsageError

SHELLS = ("bash", "zsh", "fish")
FILES = "__files__"  # a value that is a file name
STORES = "__stores__"  # a positional that is a store name
TEMPLATES = "__templates__"  # a value that is a template name


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "completion",
        help="print a shell completion script: source <(relayer completion bash)",
    )
    parser.add_argument("shell", nargs="?", choices=SHELLS, help="the shell to complete in")
    parser.add_argument("--list-stores", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--list-templates", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(handler=_completion, without_settings=True)


async def _completion(context: Context) -> int:
    arguments = context.arguments
    if arguments.list_stores:  # what the scripts ask for the names of STORE
        print("\n".join(context.settings.stores))
        return EXIT_OK
    if arguments.list_templates:  # and of --template NAME
        print("\n".join(context.settings.templates))
        return EXIT_OK
    if arguments.shell is None:
        raise UsageError(
            "completion: which shell? `relayer completion bash`, `zsh` or `fish` prints its script"
        )
    assert context.parser is not None  # main() hands every subcommand its parser
    tree = walk(context.parser)
    print({"bash": bash, "zsh": zsh, "fish": fish}[arguments.shell](tree), end="")
    return EXIT_OK


@dataclass
class Option:
    flags: tuple[str, ...]
    help: str
    values: tuple[str, ...] = ()  # choices; (FILES,) for a file; () for a flag or free text
    takes_value: bool = False


@dataclass
class Command:
    """One command path ("" for ``relayer`` itself, "parked list" for a subcommand)."""

    path: str
    help: str = ""
    options: list[Option] = field(default_factory=list)
    commands: dict[str, str] = field(default_factory=dict)  # name -> help
    positional: tuple[str, ...] = ()  # (STORES,), choices, or ()


def walk(parser: argparse.ArgumentParser, path: str = "", text: str = "") -> list[Command]:
    """Every command of ``parser``, itself first, as the scripts need them."""
    command = Command(path, text)
    found = [command]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                command.commands[name] = helps.get(name, "")
                found += walk(sub, f"{path} {name}".strip(), helps.get(name, ""))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            values: tuple[str, ...] = tuple(str(choice) for choice in action.choices or ())
            if action.dest in ("config", "token_file"):
                values = (FILES,)
            elif action.dest == "template":
                values = (TEMPLATES,)
            command.options.append(
                Option(tuple(action.option_strings), action.help or "", values, action.nargs != 0)
            )
        elif not command.positional:
            if action.dest in ("store", "stores"):
                command.positional = (STORES,)
            elif action.choices:
                command.positional = tuple(str(choice) for choice in action.choices)
    return found


def _case(pairs: dict[str, str], default: str = "") -> str:
    lines = [
        f"        {shlex.quote(key)}) echo {shlex.quote(value)} ;;" for key, value in pairs.items()
    ]
    lines.append(f"        *) echo {shlex.quote(default)} ;;")
    return "\n".join(lines)


def bash(tree: list[Command]) -> str:
    return (
        "# relayer completion for bash: source <(relayer completion bash)\n"
        + _bash_lookups(tree)
        + _bash_completer()
        + "complete -F _relayer relayer\n"
    )


def _bash_lookups(tree: list[Command]) -> str:
    """The shell functions that answer what the parser knows: a command's subcommands, its
    options, an option's values and what its positional takes."""
    commands = {command.path: " ".join(command.commands) for command in tree if command.commands}
    options = {
        command.path: " ".join(flag for option in command.options for flag in option.flags)
        for command in tree
    }
    valued = {
        f"{command.path}|{flag}": " ".join(option.values) or "-"
        for command in tree
        for option in command.options
        if option.takes_value
        for flag in option.flags
    }
    positional = {command.path: " ".join(command.positional) for command in tree}
    return f"""_relayer_commands() {{
    case "$1" in
{_case(commands)}
    esac
}}
_relayer_options() {{
    case "$1" in
{_case(options)}
    esac
}}
_relayer_values() {{  # the values of option $2 of command $1; nothing if it takes none
    case "$1|$2" in
{_case(valued)}
    esac
}}
_relayer_positional() {{
    case "$1" in
{_case({key: value for key, value in positional.items() if value})}
    esac
}}
"""


def _bash_completer() -> str:
    """``_relayer``: finds the command path in the words typed, then completes the word."""
    return f"""_relayer() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="" path="" word values i config=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if [[ -n $prev ]]; then
            [[ $prev == --config ]] && config=$word
            prev=""
        elif [[ $word == -* ]]; then
            [[ -n $(_relayer_values "$path" "$word") ]] && prev=$word
        elif [[ " $(_relayer_commands "$path") " == *" $word "* ]]; then
            path="${{path:+$path }}$word"
        fi
    done
    COMPREPLY=()
    if [[ -n $prev ]]; then
        values=$(_relayer_values "$path" "$prev")
        case $values in
            {FILES}) COMPREPLY=($(compgen -f -- "$cur")) ;;
            {TEMPLATES})
                values=$(relayer ${{config:+--config "$config"}} completion --list-templates \
                    2>/dev/null)
                COMPREPLY=($(compgen -W "$values" -- "$cur")) ;;
            -) ;;
            *) COMPREPLY=($(compgen -W "$values" -- "$cur")) ;;
        esac
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_relayer_options "$path")" -- "$cur"))
    elif [[ -n $(_relayer_commands "$path") ]]; then
        COMPREPLY=($(compgen -W "$(_relayer_commands "$path")" -- "$cur"))
    else
        values=$(_relayer_positional "$path")
        if [[ $values == {STORES} ]]; then
            values=$(relayer ${{config:+--config "$config"}} completion --list-stores 2>/dev/null)
        fi
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
    fi
}}
"""


def zsh(tree: list[Command]) -> str:
    return (
        "#compdef relayer\n"
        "# relayer completion for zsh: source <(relayer completion zsh)\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(tree).split("\n", 1)[1]
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# The fish functions that find the command path typed so far and ask for the configured names.
_FISH_FUNCTIONS = (
    "function __relayer_path",
    "    set -l path ''",
    "    set -l skip 0",
    "    for word in (commandline -opc)[2..-1]",
    "        if test $skip = 1",
    "            set skip 0",
    "        else if string match -q -- '-*' $word",
    '            contains -- "$path|$word" $__relayer_valued; and set skip 1',
    '        else if contains -- "$path|$word" $__relayer_words',
    '            set path (string trim -- "$path $word")',
    "        end",
    "    end",
    '    echo "$path"',
    "end",
    "function __relayer_at",
    '    test "$(__relayer_path)" = "$argv[1]"',
    "end",
    "function __relayer_stores",
    "    set -l words (commandline -opc)",
    "    set -l config",
    "    set -l index (contains -i -- --config $words)",
    "    and set config --config $words[(math $index + 1)]",
    "    relayer $config completion --list-stores 2>/dev/null",
    "end",
    "function __relayer_templates",
    "    set -l words (commandline -opc)",
    "    set -l config",
    "    set -l index (contains -i -- --config $words)",
    "    and set config --config $words[(math $index + 1)]",
    "    relayer $config completion --list-templates 2>/dev/null",
    "end",
)


def fish(tree: list[Command]) -> str:
    words = [f"{command.path}|{name}" for command in tree for name in command.commands]
    valued = [
        f"{command.path}|{flag}"
        for command in tree
        for option in command.options
        if option.takes_value
        for flag in option.flags
    ]
    lines = [
        "# relayer completion for fish: relayer completion fish | source",
        f"set -g __relayer_words {' '.join(_fish_quote(word) for word in words)}",
        f"set -g __relayer_valued {' '.join(_fish_quote(flag) for flag in valued)}",
        *_FISH_FUNCTIONS,
        "complete -c relayer -f",
    ]
    for command in tree:
        lines += _fish_completions(command)
    return "\n".join(lines) + "\n"


def _fish_completions(command: Command) -> list[str]:
    """The ``complete`` lines of one command: its subcommands, options and positional."""
    at = f"-n {_fish_quote('__relayer_at ' + shlex.quote(command.path))}"
    lines = [
        f"complete -c relayer {at} -a {_fish_quote(name)} -d {_fish_quote(text)}"
        for name, text in command.commands.items()
    ]
    for option in command.options:
        flags = " ".join(
            f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}" for flag in option.flags
        )
        help_text = option.help.replace("%(default)s", "")
        lines.append(
            f"complete -c relayer {at} {flags} {_fish_values(option)} -d {_fish_quote(help_text)}"
        )
    if command.positional == (STORES,):
        lines.append(f"complete -c relayer {at} -a '(__relayer_stores)'")
    elif command.positional:
        choices = _fish_quote(" ".join(command.positional))
        lines.append(f"complete -c relayer {at} -a {choices}")
    return lines


def _fish_values(option: Option) -> str:
    """What fish offers after ``option``: files, template names, its choices or nothing."""
    if option.values == (FILES,):
        return "-r -F"
    if option.values == (TEMPLATES,):
        return "-x -a '(__relayer_templates)'"
    if option.values:
        return f"-x -a {_fish_quote(' '.join(option.values))}"
    return "-x" if option.takes_value else ""

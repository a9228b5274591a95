"""docs/cli.md's reference: every `npas` command with its arguments, read from the argparse parsers."""

from __future__ import annotations

import argparse
import textwrap

from npas.presentation.cli import build_parser

WIDTH = 100  # usage lines are wrapped here, not at the terminal's width, so the page is the same everywhere


def cell(text: str) -> str:
    """Plain text for one Markdown table cell or line: whitespace folded, and the characters Markdown
    would read as markup (pipes, emphasis stars, HTML angle brackets) escaped."""
    text = " ".join(str(text).split())
    for char, escaped in (("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _invocation(action: argparse.Action) -> str:
    """How the argument is written: `space`, `--budget BUDGET`, `--dashboard [DIR]`, `--locate-lr`."""
    if not action.option_strings:
        return _metavar(action)
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return flag
    if action.nargs == "?":
        return f"{flag} [{_metavar(action)}]"
    return f"{flag} {_metavar(action)}"


def _usage(prog: str, actions: list[argparse.Action]) -> str:
    parts = []
    for a in actions:
        text = _invocation(a)
        parts.append(text if not a.option_strings or a.required else f"[{text}]")
    positionals = [p for a, p in zip(actions, parts, strict=True) if not a.option_strings]
    optionals = [p for a, p in zip(actions, parts, strict=True) if a.option_strings]
    return textwrap.fill(" ".join([prog, *positionals, *optionals]), WIDTH, subsequent_indent="    ",
                         break_on_hyphens=False, break_long_words=False)


def _default(action: argparse.Action) -> str:
    """The default where the help does not already say it."""
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    if "default" in (action.help or ""):
        return ""
    return f"`{action.default!r}`" if isinstance(action.default, str) and not action.default.strip() else \
        f"`{action.default}`"


# what an argument declared without help means, where the name alone does not say it
UNSAID = {"name": "the study's name (as given to `npas search --study`)"}


def _meaning(action: argparse.Action) -> str:
    text = (action.help or UNSAID.get(action.dest, "")).replace("%%", "%")
    if action.choices is not None and action.option_strings:
        text = (text + "; " if text else "") + "one of " + ", ".join(f"`{c}`" for c in action.choices)
    if action.required and action.option_strings:
        text = "required: " + text
    return text


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]


def _table(actions: list[argparse.Action]) -> list[str]:
    rows = ["| argument | what it does | default |", "|---|---|---|"]
    for a in actions:
        rows.append(f"| `{cell(_invocation(a))}` | {cell(_meaning(a))} | {cell(_default(a))} |")
    return rows


def render() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = ["Commands: " + ", ".join(f"[`{name}`](#npas-{name})" for name in sub.choices) + ".", "",
           "Every command takes the global flag `-v` / `--verbose` (debug logging) before its name.", ""]
    for name, p in sub.choices.items():
        actions = _arguments(p)
        what = cell(helps.get(name) or "")
        out += [f"### npas {name}", "", what[:1].upper() + what[1:] + ".", ""]
        if p.description:
            out += [cell(para) + "\n" for para in p.description.split("\n\n")]
        out += ["```text", _usage(f"npas {name}", actions), "```", ""]
        out += [*_table(actions), ""]
    return "\n".join(out)

"""The launchers' own ``%%tfcluster`` flags (``--hosts``, ``--sbatch``, a plugin's), read from each
launcher's ``line_options`` (docs/design.md, "Where a new thing goes"): nothing here knows a
launcher by name. A flag implies the launcher that takes it; one the chosen launcher does not take
is a SpecError naming the one that does.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfdist_nb.errors import SpecError
from tfdist_nb.launchers.base import LauncherOption
from tfdist_nb.launchers.registry import available, launcher_class, launcher_classes, unknown

#: The attributes of a parsed ``%%tfcluster`` line that are the magic's own: a launcher's flag
#: with one of these names is not read as the launcher's (it would take the magic's value).
MAGIC_OWN = frozenset({"spec", "on", "env", "timeout", "stall_timeout", "restart", "python",
                       "launcher", "warm", "no_dashboard", "verbose", "from_mode", "gpus",
                       "gpus_per_task"})
Schemas = Mapping[str, tuple[LauncherOption, ...]]


@dataclass(frozen=True)
class LauncherLine:
    """What a line asks of the launcher: its name (None: no launcher named or implied, so as
    the running cluster, else local), and the value and flag of each option its flags set."""

    name: str | None = None
    values: dict[str, Any] = field(default_factory=dict)  # option -> value
    flags: dict[str, str] = field(default_factory=dict)  # option -> the flag that set it


def schemas() -> dict[str, tuple[LauncherOption, ...]]:
    """Every launcher's flags by launcher name, the built-in launchers first."""
    return {name: tuple(o for o in cls.line_options if o.dest not in MAGIC_OWN)
            for name, cls in launcher_classes().items()}


def read_launcher_line(named: str | None, args: argparse.Namespace,
                       rest: Sequence[str] = ()) -> LauncherLine:
    """The launcher ``--launcher`` names (or the line's flags imply) and the options its flags
    set; SpecError for an unknown launcher, a flag it does not take, a missing required one,
    or a value its ``parse`` refuses."""
    if named and named not in available() and named not in available(fresh=True):
        raise unknown(named)
    known = schemas()
    given = _given(args, rest, known)
    name = named or _implied(given, known)
    if name is None:
        return LauncherLine()
    takes = {o.flag: o for o in launcher_class(name).line_options if o.dest not in MAGIC_OWN}
    for flag in given:
        if flag not in takes:
            raise SpecError(f"{flag} needs --launcher {_takers(flag, known)}; the {name} "
                            "launcher does not use it")
    line = LauncherLine(name)
    for option in takes.values():
        if option.flag in given:
            line.values[option.option] = _parse(option, given[option.flag])
            line.flags[option.option] = option.flag
        elif option.required:
            raise SpecError(option.missing or
                            f"--launcher {name} needs {option.flag} {option.metavar}")
    return line


def glue_values(line: str) -> str:
    """The magic line with each launcher flag's value glued on (``--sbatch=VALUE``): argparse
    would take a lone value that starts with ``-`` (``--sbatch "--nodes=2"``) for an option of
    its own, and cannot tell the value of a flag the magic does not declare from the SPEC. A
    value that starts with ``-`` is glued only to a ``dashed`` flag."""
    options = _by_flag(schemas())
    try:
        words = shlex.split(line)
    except ValueError:
        return line  # the parser says what is wrong with the quotes
    if not options.keys() & set(words[:-1]):
        return line
    glued: list[str] = []
    for word in words:  # a flag's value joins it: a glued word is no flag any more
        option = options.get(glued[-1]) if glued else None
        if option is not None and (option.dashed or not word.startswith("-")):
            glued[-1] = f"{glued[-1]}={word}"
        else:
            glued.append(word)
    return shlex.join(glued)


def _by_flag(known: Schemas) -> dict[str, LauncherOption]:
    """Each flag once (the first launcher's declaration: the built-in one where it is both)."""
    options: dict[str, LauncherOption] = {}
    for declared in known.values():
        for option in declared:
            options.setdefault(option.flag, option)
    return options


def _given(args: argparse.Namespace, rest: Sequence[str], known: Schemas) -> dict[str, str]:
    """Every launcher flag on the line and its text: the magic's declared ones from ``args``,
    the others from ``rest``; a word of ``rest`` no launcher takes is refused as argparse
    refuses it."""
    options = _by_flag(known)
    declared = {f: o for f, o in options.items() if hasattr(args, o.dest)}
    given = {f: getattr(args, o.dest) for f, o in declared.items()
             if getattr(args, o.dest) is not None}
    parser = argparse.ArgumentParser(prog="%%tfcluster", add_help=False, allow_abbrev=False)
    others = [o for f, o in options.items() if f not in declared]
    for option in others:
        parser.add_argument(option.flag, dest=option.dest, metavar=option.metavar)
    parsed, unknown = parser.parse_known_args(list(rest))
    if unknown:
        flags = [*options, *(f"--{dest.replace('_', '-')}" for dest in vars(args))]
        close = [m[0] for word in unknown if word.startswith("--") and
                 (m := difflib.get_close_matches(word.partition("=")[0], flags, n=1))]
        raise SpecError(f"unrecognized arguments: {' '.join(unknown)}" +
                        (f"; did you mean {', '.join(close)}?" if close else ""))
    given.update({o.flag: getattr(parsed, o.dest) for o in others
                  if getattr(parsed, o.dest) is not None})
    return given


def _implied(given: Mapping[str, str], known: Schemas) -> str | None:
    """The launcher a line without ``--launcher`` names by its flags: the first (built-in ones
    first) that takes them all, else the first that takes one (the others are then refused)."""
    takers = [name for name, declared in known.items()
              if given.keys() & {o.flag for o in declared}]
    if not takers:
        return None
    return next((name for name in takers
                 if given.keys() <= {o.flag for o in known[name]}), takers[0])


def _takers(flag: str, known: Schemas) -> str:
    return " or ".join(name for name, declared in known.items()
                       if flag in {o.flag for o in declared})


def _parse(option: LauncherOption, text: str) -> object:
    try:
        return option.parse(text)
    except SpecError:
        raise
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{option.flag}: {exc}") from None

"""`ov`'s entry point: the hot commands run without importing click.

Agents call `ov mail send`, `ov mail check`, `ov status` and (as their tool-call hook)
`ov guard` many times a minute, and each call is a new Python process, so start-up is
most of their cost: click alone costs more than the interpreter. A coordinator's most
frequent command, `ov sling`, is here too: the agent's first turn waits for it. This module parses
exactly those commands (and answers ``ov --version`` itself) with the same options the click commands declare (a test
compares the tables below with them, and ``ov sling``'s parsing is fuzzed against click's) and calls the same click-free bodies
(``cli.hot``, ``cli.sling_body``). Anything else, and anything unusual, goes to click untouched: every
other command, ``-h``/``--help`` anywhere, an unknown or malformed option, a bad
choice or number, missing or extra arguments, ``--``, shell completion. Errors found after parsing are shown by click
too, so usage and error messages have one source, and every error is shown by ``hot.report``,
as the click entry point shows it (JSON with ``--json``).

A hot command is a short process whose objects are freed by reference counting (a sling runs for a
tenth of a second, the others for a few milliseconds), so Python's cyclic garbage collector is switched off for it: its passes over the young objects
(one costs a hot command about 0.5 ms, the first when the imports are done) would find nothing
worth the time. Every other command (handed to click, and some run for hours) gets it back. And
once a hot command has flushed its output, its process ends at once (``os._exit``): the
interpreter's finalization (tearing down every module, freeing every object, a last collection)
cost it about 1.8 ms and does nothing a finished hot command needs, since its databases are
closed, it starts no threads and it registers no exit handlers (with one registered, the process exits as usual). Both
only when ``main`` is the program (the `ov` script, ``python -m overstory``: no ``argv`` given);
a caller passing its own arguments (the tests, in their process) keeps its collector and its
process as they are.

Some standard modules are kept out of the way until something really uses them:
``inspect`` and ``copy``, which dataclasses imports for things the hot commands never
do (the docstring of a dataclass without one; ``asdict``/``replace``), are loaded on
their first attribute access. ``typing`` is simply not imported by the hot modules of ``cli.hot``.
"""

from __future__ import annotations

import gc
import os
import sys

from overstory.deferred import DEFERRED, _Deferred, defer  # noqa: F401 - re-exported (tests, bench)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t



# ---- the hot commands' options, as their click commands declare them ----------------------------

FLAG, TEXT, ROW_ID, FILE = "flag", "text", "row id", "file"  # ROW_ID: cli._common.ROW_ID, 1 .. 2**63-1
FLAG_OFF = "flag off"  # the second half of a flag pair (--tmux/--headless): sets its parameter to False
TEXTS = "text, repeatable"  # multiple=True: a tuple of every value given, in order
NON_NEGATIVE = "float >= 0"  # click.FloatRange(min=0)
COUNT = "int >= 0"  # click.IntRange(min=0)
PATH = "path"  # click.Path(dir_okay=False, path_type=Path): need not exist; a pathlib.Path
DURATION = "duration"  # cli.budget.DURATION: 90, 90m, 4h (overstory.clock.parse_duration)
# path -> (body, {option: (parameter, kind)}, required parameters, positional arguments). The body is
# "module.function" under overstory.cli. A kind may also be ("choice", CHOICES): CHOICES is the tuple
# itself or "module:NAME", a tuple imported only when the option is given, as in the click command.
HOT_COMMANDS: dict[tuple[str, ...], tuple[str, dict[str, tuple[str, t.Any]], frozenset[str], tuple[str, ...]]] = {
    ("mail", "send"): ("hot.mail_send", {
        "--to": ("to", TEXT), "--subject": ("subject", TEXT), "--body": ("body", TEXT),
        "--body-file": ("body_file", FILE), "--type": ("type_", ("choice", "overstory.store.mail:TYPES")),
        "--priority": ("priority", ("choice", "overstory.store.mail:PRIORITIES")), "--payload": ("payload", TEXT),
        "--reply-to": ("reply_to", ROW_ID), "--from": ("from_", TEXT), "--allow-unknown": ("allow_unknown", FLAG),
        "--json": ("as_json", FLAG),
    }, frozenset({"subject"}), ()),
    ("mail", "check"): ("hot.mail_check", {
        "--agent": ("agent", TEXT), "--peek": ("peek", FLAG), "--inject": ("inject", FLAG),
        "--debounce": ("debounce", NON_NEGATIVE), "--json": ("as_json", FLAG),
    }, frozenset(), ()),
    ("status",): ("hot.status", {"--all": ("include_completed", FLAG), "--capability": ("capability", TEXT),
                                 "--state": ("state", TEXT), "--parent": ("parent", TEXT), "--run": ("run_ref", TEXT),
                                 "--json": ("as_json", FLAG)}, frozenset(), ()),
    ("guard",): ("hot.guard", {"--post": ("post", FLAG)}, frozenset(), ()),
    # Not as hot as those, but the command a coordinator runs most, and its start-up delays the agent's first turn.
    ("sling",): ("sling_body.sling", {
        "--name": ("name", TEXT), "--prompt": ("prompt", TEXT), "--spec": ("spec_file", PATH),
        "--files": ("files", TEXTS), "--parent": ("parent", TEXT),
        "--runtime": ("runtime", ("choice", "overstory.runtimes:RUNTIME_NAMES")), "--model": ("model", TEXT),
        "--provider": ("provider", TEXT), "--base-branch": ("base_branch", TEXT), "--scenario": ("scenario", PATH),
        "--tmux": ("tmux", FLAG), "--headless": ("tmux", FLAG_OFF), "--max-usd": ("max_usd", NON_NEGATIVE),
        "--max-turns": ("max_turns", COUNT), "--max-tool-calls": ("max_tool_calls", COUNT),
        "--max-wallclock": ("max_wallclock", DURATION), "--approve": ("approve", TEXTS),
        "--executor": ("executor", ("choice", ("local", "ray"))), "--group": ("group", TEXT),
        "--json": ("as_json", FLAG),
    }, frozenset(), ("capability", "task_id")),
}
HELP_OPTIONS = ("-h", "--help")
COMPLETION_ENV = "_OV_COMPLETE"  # click's shell completion for prog_name "ov"


class _Plan:
    """A hot command line, parsed: which body, with what, and the global options."""

    def __init__(self, path: tuple[str, ...], body: str, params: dict[str, t.Any], project: str | None,
                 consumed: int) -> None:
        self.path = path
        self.body = body
        self.params = params
        self.project = project
        self.consumed = consumed  # how many leading arguments were the global options and the command path


def _path_is_usable(value: str, *, directory: bool, must_exist: bool = True) -> bool:
    """What click.Path checks: ``--project`` (file_okay=False), ``--body-file`` (exists, dir_okay=False) and
    ``ov sling``'s ``--spec``/``--scenario`` (dir_okay=False, need not exist)."""
    import stat

    try:
        mode = os.stat(value).st_mode
    except OSError:
        return directory or not must_exist  # --project need not exist; --body-file must
    except ValueError:  # a NUL in it: click's os.stat raises this too, as an internal error
        return False
    if directory:
        return not stat.S_ISREG(mode) and os.access(value, os.R_OK)
    return not stat.S_ISDIR(mode) and os.access(value, os.R_OK)


def parse(args: t.Sequence[str], environ: t.Mapping[str, str] = os.environ) -> _Plan | None:
    """The plan for a hot command line, or None when click must handle it."""
    if COMPLETION_ENV in environ:
        return None
    index, project = 0, None
    while index < len(args):  # the root group's options: --project PATH, -v/--verbose
        arg = args[index]
        if arg in ("-v", "--verbose"):
            index += 1
        elif arg == "--project":
            if index + 1 >= len(args):
                return None
            project, index = args[index + 1], index + 2
        elif arg.startswith("--project="):
            project, index = arg[len("--project="):], index + 1
        else:
            break
    if project is None and environ.get("OVERSTORY_PROJECT_ROOT"):
        project = environ["OVERSTORY_PROJECT_ROOT"]  # click reads the option's envvar and checks it the same way
    if project is not None and not _path_is_usable(project, directory=True):
        return None
    for path, (body, options, required, arguments) in HOT_COMMANDS.items():  # noqa: B007 (the entry found is used)
        if tuple(args[index:index + len(path)]) == path:
            break
    else:
        return None
    params = parse_options(args[index + len(path):], options, arguments)
    if params is None or not required <= params.keys():
        return None
    return _Plan(path, body, params, project, index + len(path))


def parse_options(args: t.Sequence[str], options: dict[str, tuple[str, t.Any]],
                  arguments: tuple[str, ...] = ()) -> dict[str, t.Any] | None:
    """A command's parameters from its words (options as click parses them, and exactly ``arguments``
    positional words), only those given; None for anything click should see instead."""
    params: dict[str, t.Any] = {}
    given: dict[str, tuple[str, t.Any]] = {}  # an option with a value: its last one and its kind, converted at the end
    positional: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-"):
            positional.append(arg)  # click takes arguments between options too
            index += 1
            continue
        if not arg.startswith("--") or arg == "--" or arg in HELP_OPTIONS:
            return None  # a short option, a lone `-`, `--` or help: none of these here
        name, has_value, value = arg.partition("=")
        spec = options.get(name)
        if spec is None:
            return None
        parameter, kind = spec
        if kind in (FLAG, FLAG_OFF):
            if has_value:
                return None
            params[parameter] = kind == FLAG  # a flag pair given twice: the last one wins, as in click
            index += 1
            continue
        if not has_value:
            if index + 1 >= len(args):
                return None
            value = args[index + 1]  # like click: the next word, whatever it looks like
            index += 1
        index += 1
        if kind == TEXTS:
            params[parameter] = (*params.get(parameter, ()), value)
        else:
            given[parameter] = (value, kind)  # given twice: the last one wins, and click converts only it
    if len(positional) != len(arguments):
        return None  # missing or extra arguments: click says which
    for parameter, (value, kind) in given.items():
        converted = _convert(value, kind)
        if converted is None:
            return None
        params[parameter] = converted
    params.update(zip(arguments, positional))
    return params


def _convert(value: str, kind: t.Any) -> t.Any:
    if kind == TEXT:
        return value
    if kind in (ROW_ID, COUNT):
        try:
            number = int(value)
        except ValueError:
            return None
        low, high = (1, 2**63 - 1) if kind == ROW_ID else (0, None)
        return number if low <= number and (high is None or number <= high) else None
    if kind == FILE:
        return value if _path_is_usable(value, directory=False) else None
    if kind == PATH:
        if not _path_is_usable(value, directory=False, must_exist=False):
            return None
        from pathlib import Path

        return Path(value)
    if kind == NON_NEGATIVE:
        try:
            number = float(value)
        except ValueError:
            return None
        return number if 0 <= number < float("inf") else None  # nan fails both: click says what it makes of it
    if kind == DURATION:
        from overstory.clock import parse_duration

        try:
            return parse_duration(value)
        except ValueError:
            return None
    return value if value in choices(kind) else None


def choices(kind: tuple[str, t.Any]) -> t.Collection[str]:
    """The values a ("choice", ...) kind allows (a tuple, or the keys of a dict such as mail's PRIORITIES)."""
    source = kind[1]
    if isinstance(source, tuple):
        return source
    module, _, name = source.partition(":")
    found: t.Collection[str] = getattr(__import__(module, fromlist=[name]), name)
    return found


def body_of(name: str) -> t.Callable[..., t.Any]:
    """A command's click-free body: "module.function" under overstory.cli."""
    module, _, function = name.partition(".")
    found: t.Callable[..., t.Any] = getattr(__import__(f"overstory.cli.{module}", fromlist=[function]), function)
    return found


# ---- running one -------------------------------------------------------------------------------


def run(plan: _Plan, args: t.Sequence[str]) -> int:
    """Run a parsed hot command; errors are reported as the click entry point reports them (``hot.report``)."""
    from overstory.cli import hot

    try:
        body_of(plan.body)(plan.project, **plan.params)
    except hot.BadUsage as exc:
        return hot.report(_as_click_error(plan, exc), args)
    except (Exception, KeyboardInterrupt) as exc:
        return hot.report(exc, args)
    return 0


def _as_click_error(plan: _Plan, exc: t.Any) -> Exception:
    """A hot command's usage error as the click command would raise it (click shows it, or its message goes into
    the JSON error)."""
    import click

    from overstory.cli.main import cli

    ctx = cli.make_context("ov", [], resilient_parsing=True)
    command: click.Command = cli
    for name in plan.path:
        assert isinstance(command, click.Group)
        found = command.get_command(ctx, name)
        assert found is not None
        command = found
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    return (click.BadParameter(exc.message, ctx=ctx, param_hint=exc.param_hint) if exc.param_hint is not None
            else click.UsageError(exc.message, ctx=ctx))


VERSION_OPTIONS = ("-V", "--version")  # the root group's click.version_option


def main(argv: t.Sequence[str] | None = None) -> t.NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 1 and args[0] in VERSION_OPTIONS and COMPLETION_ENV not in os.environ:
        from overstory import __version__  # what click's version_option prints, without click (5x `python -c pass`)

        sys.stdout.write(f"ov {__version__}\n")
        sys.stdout.flush()
        sys.exit(0)
    program = argv is None and gc.isenabled()  # the process's own command (the `ov` script), not a function call
    if program:
        gc.disable()  # for a hot command: see the module's docstring
    for name in DEFERRED:
        defer(name)
    plan = parse(args)
    if plan is None or plan.path == ("sling",):
        # pathlib imports urllib.parse (and with it ipaddress: 2 ms) for Path.as_uri alone; as in the agent loop.
        # (Not for the commands of cli.hot: those import neither pathlib nor the urllib package the stand-in goes
        # into. A sling whose --spec or --scenario already brought pathlib in keeps the real module.)
        defer("urllib.parse", "quote_from_bytes")
    if plan is None:
        if program:
            gc.enable()
        from overstory.cli.main import main as click_main

        click_main(args)
    if not program:
        sys.exit(run(plan, args))
    try:
        code: object = run(plan, args)
    except SystemExit as exc:  # `ov guard` exits with its CLI's status
        code = exc.code
    _end_process(code)


def _end_process(code: object) -> t.NoReturn:
    """Exit with ``code`` as ``sys.exit`` would, skipping the interpreter's finalization (see the module's
    docstring) when the output is flushed and nothing registered an exit handler."""
    import atexit

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a closed pipe, say: the interpreter's own exit deals with it, as before
        sys.exit(code)
    handlers = getattr(atexit, "_ncallbacks", None)
    if handlers is None or handlers() or not (code is None or isinstance(code, int)):
        sys.exit(code)  # an exit handler to run, or a message to print: the usual way
    os._exit(code or 0)

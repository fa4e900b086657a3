"""`ov`'s entry point: the hot commands run without importing click.

Agents call `ov mail send`, `ov mail check`, `ov status` and (as their tool-call hook)
`ov guard` many times a minute, and each call is a new Python process, so start-up is
most of their cost: click alone costs more than the interpreter. This module parses
exactly those commands (and answers ``ov --version`` itself) with the same options the click commands declare (a test
compares the tables below with them) and calls the same click-free bodies
(``cli.hot``). Anything else, and anything unusual, goes to click untouched: every
other command, ``-h``/``--help`` anywhere, an unknown or malformed option, a bad
choice or number, shell completion. Errors found after parsing are shown by click
too, so usage and error messages have one source, and every error is shown by ``hot.report``,
as the click entry point shows it (JSON with ``--json``).

A hot command is a process of a few milliseconds whose objects are freed by reference counting,
so Python's cyclic garbage collector is switched off for it: its passes over the young objects
(one costs a hot command about 0.5 ms, the first when the imports are done) would find nothing
worth the time. Every other command (handed to click, and some run for hours) gets it back. And
once a hot command has flushed its output, its process ends at once (``os._exit``): the
interpreter's finalization (tearing down every module, freeing every object, a last collection)
cost it about 1.8 ms and does nothing a finished hot command needs, since its databases are
closed and it registers no exit handlers (with one registered, the process exits as usual). Both
only when ``main`` is the program (the `ov` script, ``python -m overstory``: no ``argv`` given);
a caller passing its own arguments (the tests, in their process) keeps its collector and its
process as they are.

Some standard modules are kept out of the way until something really uses them:
``inspect`` and ``copy``, which dataclasses imports for things the hot commands never
do (the docstring of a dataclass without one; ``asdict``/``replace``), are loaded on
their first attribute access. ``typing`` is simply not imported by the hot modules.
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
SECONDS = "seconds"  # click.FloatRange(min=0)
# path -> (body in cli.hot, {option: (parameter, kind)}, required parameters). A kind may also
# be ("choice", NAME): the choices are overstory.store.mail.NAME, as in the click command.
HOT_COMMANDS: dict[tuple[str, ...], tuple[str, dict[str, tuple[str, t.Any]], frozenset[str]]] = {
    ("mail", "send"): ("mail_send", {
        "--to": ("to", TEXT), "--subject": ("subject", TEXT), "--body": ("body", TEXT),
        "--body-file": ("body_file", FILE), "--type": ("type_", ("choice", "TYPES")),
        "--priority": ("priority", ("choice", "PRIORITIES")), "--payload": ("payload", TEXT),
        "--reply-to": ("reply_to", ROW_ID), "--from": ("from_", TEXT), "--allow-unknown": ("allow_unknown", FLAG),
        "--json": ("as_json", FLAG),
    }, frozenset({"subject"})),
    ("mail", "check"): ("mail_check", {
        "--agent": ("agent", TEXT), "--peek": ("peek", FLAG), "--inject": ("inject", FLAG),
        "--debounce": ("debounce", SECONDS), "--json": ("as_json", FLAG),
    }, frozenset()),
    ("status",): ("status", {"--all": ("include_completed", FLAG), "--capability": ("capability", TEXT),
                             "--state": ("state", TEXT), "--parent": ("parent", TEXT), "--run": ("run_ref", TEXT),
                             "--json": ("as_json", FLAG)}, frozenset()),
    ("guard",): ("guard", {"--post": ("post", FLAG)}, frozenset()),
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


def _path_is_usable(value: str, *, directory: bool) -> bool:
    """What click.Path checks: ``--project`` (file_okay=False) and ``--body-file`` (exists, dir_okay=False)."""
    import stat

    try:
        mode = os.stat(value).st_mode
    except OSError:
        return directory  # --project need not exist; --body-file must
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
    for path, (body, options, required) in HOT_COMMANDS.items():  # noqa: B007 (the entry found is used below)
        if tuple(args[index:index + len(path)]) == path:
            break
    else:
        return None
    params = _parse_options(args[index + len(path):], options)
    if params is None or not required <= params.keys():
        return None
    return _Plan(path, body, params, project, index + len(path))


def _parse_options(args: t.Sequence[str], options: dict[str, tuple[str, t.Any]]) -> dict[str, t.Any] | None:
    params: dict[str, t.Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--") or arg == "--" or arg in HELP_OPTIONS:
            return None  # an argument, a short option, `--` or help: the hot commands take none of these here
        name, has_value, value = arg.partition("=")
        spec = options.get(name)
        if spec is None:
            return None
        parameter, kind = spec
        if kind == FLAG:
            if has_value:
                return None
            params[parameter] = True
            index += 1
            continue
        if not has_value:
            if index + 1 >= len(args):
                return None
            value = args[index + 1]  # like click: the next word, whatever it looks like
            index += 1
        index += 1
        converted = _convert(value, kind)
        if converted is None:
            return None
        params[parameter] = converted  # given twice: the last one wins, as in click
    return params


def _convert(value: str, kind: t.Any) -> t.Any:
    if kind == TEXT:
        return value
    if kind == ROW_ID:
        try:
            number = int(value)
        except ValueError:
            return None
        return number if 1 <= number <= 2**63 - 1 else None
    if kind == FILE:
        return value if _path_is_usable(value, directory=False) else None
    if kind == SECONDS:
        try:
            seconds = float(value)
        except ValueError:
            return None
        return seconds if 0 <= seconds < float("inf") else None  # nan fails both: click says why
    from overstory.store import mail as store

    return value if value in getattr(store, kind[1]) else None


# ---- running one -------------------------------------------------------------------------------


def run(plan: _Plan, args: t.Sequence[str]) -> int:
    """Run a parsed hot command; errors are reported as the click entry point reports them (``hot.report``)."""
    from overstory.cli import hot

    try:
        getattr(hot, plan.body)(plan.project, **plan.params)
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
    if plan is None:
        # pathlib imports urllib.parse (and with it ipaddress: 2 ms) for Path.as_uri alone; as in the agent loop.
        # (Not for a hot command: those import neither pathlib nor the urllib package the stand-in goes into.)
        defer("urllib.parse", "quote_from_bytes")
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

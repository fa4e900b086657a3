"""Handlers for file and text tools: which of their arguments they write, if any.

Coreutils-style commands (tee, cp, mv, rm, chmod, dd …), editors that work in place
(perl, yq), find, archivers and downloaders (unzip, gzip, curl, wget). sed, awk, sort
and tar are in ``textproc``. Each handler reads the argument list the way the tool does, just far enough to
find output files and in-place edits.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _NULL_SINKS
from overstory.guards.chars import is_remote_path
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _values,
)


def _tee(argv: list[str], *_rest: object) -> _Effect:
    _, files = _parse_options(argv[1:], ("--output-error",))
    files = [f for f in files if f not in _NULL_SINKS]
    if not files:
        return _READ
    return _Effect("write", what=f"write files with tee ({' '.join(files)})", targets=files)


def _uniq(argv: list[str], *_rest: object) -> _Effect:
    _, positionals = _parse_options(argv[1:], ("-f", "-s", "-w", "--skip-fields",
                                                     "--skip-chars", "--check-chars"))
    if len(positionals) >= 2:
        return _Effect("write", what="write a file with `uniq IN OUT`", targets=positionals[1:2])
    return _READ


def _output_option(*flags: str, label: str) -> _Handler:
    def handler(argv: list[str], *_rest: object) -> _Effect:
        options, _ = _parse_options(argv[1:], flags)
        outputs = [o for o in _values(options, *flags) if o != "-"]
        if outputs:
            return _Effect("write", what=f"write a file with `{label}`", targets=outputs)
        return _READ

    return handler


def _xxd(argv: list[str], *_rest: object) -> _Effect:
    _, positionals = _parse_options(argv[1:], ("-c", "-g", "-l", "-s", "-o", "-n", "-C"))
    if len(positionals) >= 2:
        return _Effect("write", what="write a file with `xxd IN OUT`", targets=positionals[1:2])
    return _READ


_MAX_FIND_COMMANDS = 256


def _find(argv: list[str], *_rest: object) -> _Effect:
    args = argv[1:]
    roots: list[str] = []
    i = 0
    while i < len(args) and args[i] in ("-H", "-L", "-P", "-O0", "-O1", "-O2", "-O3", "-D"):
        i += 2 if args[i] == "-D" else 1
    while i < len(args) and not args[i].startswith(("-", "(", "!", ")")):
        roots.append(args[i])
        i += 1
    roots = roots or ["."]
    effect = _Effect("read")
    while i < len(args):
        arg = args[i]
        if arg in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end] not in (";", "+"):
                end += 1
            template = args[i + 1 : end]
            if len(effect.inner) + len(roots) > _MAX_FIND_COMMANDS:
                return _Effect("deny", reason=(
                    f"this `find` runs commands for {len(roots)} start points and several `-exec`s: "
                    "too many combinations to check; use fewer start points."))
            for root in roots:
                found = os.path.join(root, "{}")
                effect.inner.append([found if word == "{}" else word for word in template])
            i = end + 1
            continue
        if arg == "-delete":
            effect.kind = "write"
            effect.what = "delete files (`find -delete`)"
            effect.targets.extend(roots)
        elif arg in ("-fprint", "-fprint0", "-fls", "-fprintf") and i + 1 < len(args):
            effect.kind = "write"
            effect.what = f"write a file with `find {arg}`"
            effect.targets.append(args[i + 1])
        i += 1
    return effect


def _targets_all(label: str, value_options: tuple[str, ...] = (), *, removes: bool = False) -> _Handler:
    """A command that writes every positional argument (rm, touch, mkdir …)."""

    def handler(argv: list[str], *_rest: object) -> _Effect:
        _, positionals = _parse_options(argv[1:], value_options)
        return _Effect("write", what=label, targets=positionals, removes=removes)

    return handler


# One clause per comma; each operator starts its own group, so matching stays linear.
_MODE_CLAUSE = r"[ugoa]*(?:[-+=](?:[rwxXst]*|[ugo]))+"
_MODE_RE = rf"^{_MODE_CLAUSE}(?:,{_MODE_CLAUSE})*$|^[0-7]{{3,4}}$|^-[rwxXst]+$"  # re: chmod only


def _chmod_like(label: str, *, has_mode: bool) -> _Handler:
    """chmod/chown/chgrp: the first positional (mode, owner) is not a file."""

    def handler(argv: list[str], *_rest: object) -> _Effect:
        options, positionals = _parse_options(argv[1:], ("--reference", "--from"))
        if not _values(options, "--reference"):
            import re  # the other file tools do not need it

            modes = [a for a in argv[1:] if has_mode and re.match(_MODE_RE, a)]
            if modes:  # `chmod -x f` parses the mode as an option
                positionals = [p for p in positionals if p not in modes]
            else:
                positionals = positionals[1:]
        return _Effect("write", what=label, targets=positionals)

    return handler


def _copy_like(label: str, value_options: tuple[str, ...] = (), *, moves: bool = False,
               one_means_cwd: bool = False) -> _Handler:
    """cp, mv, ln, install, rsync: the destination is written; mv also removes its sources."""

    def handler(argv: list[str], *_rest: object) -> _Effect:
        options, positionals = _parse_options(
            argv[1:], ("-t", "--target-directory", "-S", "--suffix", *value_options)
        )
        directory = _values(options, "-t", "--target-directory")
        if directory:
            targets = directory + (positionals if moves else [])
        elif len(positionals) >= 2:
            targets = positionals if moves else positionals[-1:]
        else:
            targets = ["."] if positionals and one_means_cwd else positionals
        targets = [t for t in targets if not is_remote_path(t)]  # ^([\w.-]+@)?[\w.-]+:
        return _Effect("write", what=label, targets=targets, removes=moves)

    return handler


def _dd(argv: list[str], *_rest: object) -> _Effect:
    outputs = [a[3:] for a in argv[1:] if a.startswith("of=")]
    return _Effect("write", what="write a file with dd", targets=outputs) if outputs else _READ


def _truncate(argv: list[str], *_rest: object) -> _Effect:
    _, positionals = _parse_options(argv[1:], ("-s", "--size", "-r", "--reference"))
    return _Effect("write", what="truncate files", targets=positionals)


def _patch(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(
        argv[1:], ("-d", "--directory", "-o", "--output", "-i", "--input", "-p", "--strip",
                   "-B", "--prefix", "-r", "--reject-file", "-z", "--suffix", "-F", "--fuzz")
    )
    outputs = _values(options, "-o", "--output")
    directory = _values(options, "-d", "--directory")
    if "--dry-run" in _names(options):
        return _READ
    return _Effect("write", what="patch files", targets=outputs or positionals[:1],
                   writes_cwd=not (outputs or positionals), chdir=directory[0] if directory else None)


def _unzip(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-d", "-x"))
    if _names(options) & {"-l", "-t", "-v", "-Z", "-p", "-c", "-z"}:
        return _READ
    directory = _values(options, "-d")
    return _Effect("write", what="extract files with unzip", targets=directory,
                   writes_cwd=not directory)


def _compressor(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-S", "--suffix", "-T", "--threads"))
    if _names(options) & {"-c", "--stdout", "--to-stdout", "-l", "--list", "-t", "--test",
                          "-h", "--help", "-V", "--version"} or not positionals:
        return _READ
    return _Effect("write", what=f"replace files with {os.path.basename(argv[0])}",
                   targets=positionals)


def _curl(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(
        argv[1:], ("-o", "--output", "-D", "--dump-header", "-c", "--cookie-jar",
                   "--output-dir", "-H", "--header", "-d", "--data", "-X", "--request",
                   "-u", "--user", "-A", "--user-agent", "-e", "--referer", "-b", "--cookie",
                   "-F", "--form", "-T", "--upload-file", "-m", "--max-time", "-w",
                   "--write-out", "-x", "--proxy", "--data-raw", "--data-binary",
                   "--connect-timeout", "-K", "--config", "--retry", "-r", "--range")
    )
    targets = [o for o in _values(options, "-o", "--output", "-D", "--dump-header", "-c",
                                  "--cookie-jar", "--output-dir") if o != "-"]
    remote_name = bool(_names(options) & {"-O", "--remote-name", "--remote-name-all", "-J"})
    if targets or remote_name:
        return _Effect("write", what="download into a file with curl", targets=targets,
                       writes_cwd=remote_name and not _values(options, "--output-dir"))
    return _READ


def _wget(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-O", "--output-document", "-P",
                                           "--directory-prefix", "-o", "--output-file",
                                           "-a", "--append-output", "-U", "--user-agent",
                                           "-T", "--timeout", "-t", "--tries"))
    if "--spider" in _names(options):
        return _READ
    documents = _values(options, "-O", "--output-document")
    if documents and all(d in ("-", "/dev/null") for d in documents):
        return _READ
    targets = [d for d in documents if d != "-"] + _values(options, "-P", "--directory-prefix")
    targets += _values(options, "-o", "--output-file", "-a", "--append-output")
    return _Effect("write", what="download into a file with wget", targets=targets,
                   writes_cwd=not documents and not _values(options, "-P", "--directory-prefix"))


def _yq(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-o", "--output-format", "-p",
                                                     "--input-format", "--indent"))
    if _names(options) & {"-i", "--inplace"}:
        return _Effect("write", what="edit files in place (`yq -i`)", targets=positionals[1:])
    return _READ


def _perl(argv: list[str], *_rest: object) -> _Effect:
    args = argv[1:]
    if args and all(a in _VERSION_FLAGS for a in args):
        return _READ
    in_place = code_given = False
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positionals.extend(args[i + 1 :])
            break
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            cluster = arg[1:]
            for j, flag in enumerate(cluster):
                if flag == "i":  # the rest of the cluster is a backup suffix
                    in_place = True
                    break
                if flag in "eE":
                    code_given = True
                    if not cluster[j + 1 :]:
                        i += 1  # the code is the next argument
                    break
                if flag in "IMmxlo0":
                    break  # value attached to the flag
        else:
            positionals.append(arg)
        i += 1
    if in_place:
        files = positionals if code_given else positionals[1:]
        return _Effect("write", what="edit files in place (`perl -i`)", targets=files)
    return _Effect("code", what="`perl` code")


def _split(argv: list[str], *_rest: object) -> _Effect:
    return _Effect("write", what=f"write files with {argv[0]}", writes_cwd=True)


HANDLERS: dict[str, _Handler] = {
    "tee": _tee,
    "uniq": _uniq,
    "shuf": _output_option("-o", "--output", label="shuf -o"),
    "iconv": _output_option("-o", "--output", label="iconv -o"),
    "xxd": _xxd,
    "tree": _output_option("-o", label="tree -o"),
    "split": _split,
    "csplit": _split,
    "find": _find,
    "rm": _targets_all("delete files", removes=True),
    "rmdir": _targets_all("delete directories", removes=True),
    "unlink": _targets_all("delete files", removes=True),
    "shred": _targets_all("destroy files", ("-n", "-s", "--iterations", "--size"), removes=True),
    "touch": _targets_all("create files with touch", ("-d", "-t", "-r", "--date", "--reference")),
    "mkdir": _targets_all("create directories", ("-m", "--mode")),
    "mkfifo": _targets_all("create fifos", ("-m", "--mode")),
    "mknod": _targets_all("create device files", ("-m", "--mode")),
    "truncate": _truncate,
    "chmod": _chmod_like("change file modes", has_mode=True),
    "chown": _chmod_like("change file owners", has_mode=False),
    "chgrp": _chmod_like("change file groups", has_mode=False),
    "cp": _copy_like("copy files"),
    "install": _copy_like("install files", ("-m", "--mode", "-o", "--owner", "-g", "--group")),
    "rsync": _copy_like("copy files with rsync", ("-e", "--rsh", "--exclude", "--include",
                                                  "--backup-dir", "-f", "--filter")),
    "scp": _copy_like("copy files with scp", ("-P", "-i", "-o", "-F", "-J", "-l", "-c")),
    "ln": _copy_like("create links", one_means_cwd=True),
    "mv": _copy_like("move files", moves=True),
    "dd": _dd,
    "patch": _patch,
    "unzip": _unzip,
    "gzip": _compressor,
    "gunzip": _compressor,
    "bzip2": _compressor,
    "bunzip2": _compressor,
    "xz": _compressor,
    "unxz": _compressor,
    "zstd": _compressor,
    "curl": _curl,
    "wget": _wget,
    "yq": _yq,
    "perl": _perl,
}

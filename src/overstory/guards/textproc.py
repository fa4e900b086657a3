"""sed, awk, sort and tar: readers whose scripts or options can write files or run programs.

sed scripts are parsed command by command (a small parser, not a pattern match), so
``1w path``, ``/x/I w path``, ``s/a/b/w path`` and ``e`` are all seen; anything the
parser does not understand is treated as code. For read-only agents these programs must
be positively read-only: an option ov does not know is refused (``unsafe``), since
``sort --compress-program``, ``tar -I`` or ``awk -d`` run programs or write files.
"""

from __future__ import annotations

from overstory.guards.effects import _Effect, _Handler, _names, _parse_options, _values

# ---- sed

_SED_VALUE = ("-e", "--expression", "-f", "--file", "-l", "--line-length")
_SED_SAFE = frozenset({"-n", "--quiet", "--silent", "-E", "-r", "--regexp-extended", "-s",
                       "--separate", "-z", "--null-data", "-u", "--unbuffered", "--posix",
                       "--debug", "--sandbox", "-e", "--expression", "-l", "--line-length",
                       "--help", "--version", "-b", "--binary"})


def _sed(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], _SED_VALUE)
    names = _names(options)
    scripts = _values(options, "-e", "--expression")
    files = positionals
    if not scripts and not _values(options, "-f", "--file") and positionals:
        scripts, files = positionals[:1], positionals[1:]
    if names & {"-i", "--in-place"} or any(k.startswith("--in-place") for k in names):
        return _Effect("write", what="edit files in place (`sed -i`)", targets=files)
    if _values(options, "-f", "--file"):
        return _Effect("code", what="a sed script file (it cannot be checked for writes)")
    writes: list[str] = []
    for script in scripts:
        known, written = sed_script(script)
        if not known:
            return _Effect("code", what="a sed script with commands ov cannot check (`e`, or syntax "
                           "it does not know)")
        writes.extend(written)
    if writes and "--sandbox" not in names:
        return _Effect("write", what=f"write files from a sed script (`w {writes[0]}`)", targets=writes)
    unknown = [k for k, _ in options if k not in _SED_SAFE]
    return _Effect("read", unsafe=f"run `sed {unknown[0]}`, an option ov does not know" if unknown else "")


_SED_SIMPLE = frozenset("=dDgGhHlnNpPxzFqQLkK")


def sed_script(script: str) -> tuple[bool, list[str]]:
    """Parse a sed script: (every command understood and none runs a program, files written)."""
    writes: list[str] = []
    i, n = 0, len(script)
    try:
        while i < n:
            c = script[i]
            if c in " \t\n;}":
                i += 1
                continue
            if c == "#":
                i = _line_end(script, i)
                continue
            i = _sed_address(script, i, first=True)
            i = _spaces(script, i)
            if i < n and script[i] == ",":
                i = _sed_address(script, _spaces(script, i + 1), first=False)
            i = _spaces(script, i)
            while i < n and script[i] in "! \t":
                i += 1
            if i >= n:
                return False, writes
            command = script[i]
            i += 1
            if command == "{":
                continue
            if command in _SED_SIMPLE:
                while i < n and script[i].isdigit():
                    i += 1
            elif command in "aic":
                i = _line_end(script, i, escapes=True)
            elif command in "rR":
                i = _line_end(script, i)
            elif command in "wW":
                end = _line_end(script, i)
                writes.append(script[i:end].strip())
                i = end
            elif command in "btT:v":
                while i < n and script[i] not in ";\n":
                    i += 1
            elif command in "sy":
                i = _sed_parts(script, i, 2)
                if command == "s":
                    j = i
                    while j < n and script[j] in "gpiImMe0123456789":
                        j += 1
                    if "e" in script[i:j]:
                        return False, writes
                    i = j
                    if i < n and script[i] == "w":
                        end = _line_end(script, i + 1)
                        writes.append(script[i + 1 : end].strip())
                        i = end
            else:
                return False, writes  # `e`, or a command ov does not know
    except ValueError:
        return False, writes
    return True, writes


def _spaces(script: str, i: int) -> int:
    while i < len(script) and script[i] in " \t":
        i += 1
    return i


def _line_end(script: str, i: int, *, escapes: bool = False) -> int:
    n = len(script)
    while i < n and script[i] != "\n":
        i += 2 if escapes and script[i] == "\\" else 1
    return min(i, n)


def _sed_address(script: str, i: int, *, first: bool) -> int:
    n = len(script)
    if i >= n:
        return i
    c = script[i]
    if c.isdigit():
        while i < n and (script[i].isdigit() or script[i] == "~"):
            i += 1
        return i
    if c == "$":
        return i + 1
    if not first and c in "+~":
        i += 1
        while i < n and script[i].isdigit():
            i += 1
        return i
    if c == "/" or c == "\\":
        if c == "\\":
            i += 1
            if i >= n:
                raise ValueError("sed: no delimiter")
        i = _sed_parts(script, i, 1)
        while i < n and script[i] in "IM":
            i += 1
    return i


def _sed_parts(script: str, i: int, count: int) -> int:
    """From a delimiter at ``i``, skip ``count`` delimited parts; return the index after."""
    n = len(script)
    if i >= n or script[i] in "\n\\":
        raise ValueError("sed: bad delimiter")
    delimiter = script[i]
    i += 1
    for _ in range(count):
        while i < n and script[i] != delimiter:
            i += 2 if script[i] == "\\" else 1
        if i >= n:
            raise ValueError("sed: unterminated")
        i += 1
    return i


# ---- awk

_AWK_VALUE = ("-F", "-v", "-f", "-e", "-i", "-l", "-E", "--include", "--file", "--assign",
              "--field-separator", "--source", "--load", "--exec")
_AWK_SAFE = frozenset({"-F", "--field-separator", "-v", "--assign", "-e", "--source", "-b",
                       "--characters-as-bytes", "-c", "--traditional", "-P", "--posix", "-r",
                       "--re-interval", "-S", "--sandbox", "-N", "--use-lc-numeric", "-n",
                       "--non-decimal-data", "-M", "--bignum", "-O", "--optimize", "-s",
                       "--no-optimize", "--version", "--help", "-h", "-V"})
_AWK_RUNS = r"\bsystem\b|\||@"  # re: awk only


def _awk(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], _AWK_VALUE)
    if "inplace" in _values(options, "-i", "--include"):
        return _Effect("write", what="edit files in place (`awk -i inplace`)",
                       targets=positionals[1:])
    if _values(options, "-f", "--file", "-E", "--exec", "-l", "--load", "-i", "--include"):
        return _Effect("code", what="an awk program file or extension (it cannot be checked for writes)")
    sources = _values(options, "-e", "--source")
    programs = sources or positionals[:1]
    if any(_awk_writes(p) for p in programs):
        return _Effect("code", what="an awk program that writes files or runs commands")
    unknown = [k for k, _ in options if k not in _AWK_SAFE]
    return _Effect("read", unsafe=f"run `awk {unknown[0]}`, an option ov does not know (some "
                   "write files)" if unknown else "")


def _awk_writes(program: str) -> bool:
    """Does an awk program run commands (``system``, ``|``, ``@``) or print into a file?

    Strings and regular expressions are blanked out first, so ``/a|b/`` is not a pipe.
    """
    import re  # sed, sort and tar do not need it

    code = _awk_code(program)
    if re.search(_AWK_RUNS, code):
        return True
    for piece in re.split(r"[;{}\n]", code):
        at = piece.find("print")
        if at >= 0 and ">" in piece[at:]:
            return True
    return False


def _awk_code(program: str) -> str:
    """The program with string and regex literals replaced by spaces (linear)."""
    out: list[str] = []
    i, n = 0, len(program)
    previous = ""  # last significant character outside literals
    while i < n:
        c = program[i]
        if c == '"' or (c == "/" and (previous == "" or previous in "(,{;!~&|?:\n=<>+-*%^")):
            j = i + 1
            while j < n and program[j] != c and program[j] != "\n":
                j += 2 if program[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
            previous = "x"
            continue
        if c == "#":
            j = program.find("\n", i)
            i = n if j < 0 else j
            continue
        out.append(c)
        if not c.isspace():
            previous = c
        i += 1
    return "".join(out)


# ---- sort

_SORT_VALUE = ("-o", "--output", "-k", "--key", "-t", "--field-separator", "-S", "--buffer-size",
               "-T", "--temporary-directory", "--parallel", "--files0-from", "--batch-size",
               "--compress-program", "--random-source", "--sort")
_SORT_SAFE = frozenset({"-b", "--ignore-leading-blanks", "-d", "--dictionary-order", "-f",
                        "--ignore-case", "-g", "--general-numeric-sort", "-i",
                        "--ignore-nonprinting", "-M", "--month-sort", "-h",
                        "--human-numeric-sort", "-n", "--numeric-sort", "-R", "--random-sort",
                        "-r", "--reverse", "-V", "--version-sort", "-c", "-C", "--check", "-m",
                        "--merge", "-s", "--stable", "-u", "--unique", "-z", "--zero-terminated",
                        "--debug", "-k", "--key", "-t", "--field-separator", "-S", "--buffer-size",
                        "--parallel", "--files0-from", "--batch-size", "--random-source", "--sort",
                        "--help", "--version"})


def _sort(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], _SORT_VALUE)
    names = _names(options)
    if names & {"--compress-program"}:
        return _Effect("code", what="`sort --compress-program` (it runs a program)")
    outputs = _values(options, "-o", "--output") + _values(options, "-T", "--temporary-directory")
    if outputs:
        return _Effect("write", what="write files with `sort -o`/`-T`", targets=outputs)
    unknown = [k for k, _ in options if k not in _SORT_SAFE]
    return _Effect("read", unsafe=f"run `sort {unknown[0]}`, an option ov does not know" if unknown else "")


# ---- tar

_TAR_VALUE = ("-f", "--file", "-C", "--directory", "-T", "--files-from", "-X", "--exclude-from",
              "-b", "--blocking-factor", "-H", "--format", "-I", "--use-compress-program",
              "--to-command", "--checkpoint-action", "--info-script", "-F", "--new-volume-script",
              "--rsh-command", "--rmt-command", "-g", "--listed-incremental", "--index-file",
              "--volno-file", "--exclude", "--strip-components", "--transform", "--xform",
              "--quoting-style", "--checkpoint", "--occurrence", "-K", "--starting-file", "-N",
              "--newer", "--owner", "--group", "--mode", "--mtime", "-V", "--label")
_TAR_RUNS = frozenset({"-I", "--use-compress-program", "--to-command", "--checkpoint-action",
                       "--info-script", "-F", "--new-volume-script", "--rsh-command",
                       "--rmt-command"})
_TAR_READ_SAFE = frozenset({"-t", "--list", "-x", "--extract", "--get", "-O", "--to-stdout",
                            "-f", "--file", "-v", "--verbose", "-z", "--gzip", "--gunzip", "-j",
                            "--bzip2", "-J", "--xz", "--zstd", "--lzma", "--lzip", "--lzop", "-a",
                            "--auto-compress", "--wildcards", "--no-wildcards", "--anchored",
                            "--no-anchored", "--exclude", "-C", "--directory",
                            "--strip-components", "--occurrence", "--numeric-owner", "--utc",
                            "--full-time", "--quoting-style", "-T", "--files-from", "-X",
                            "--exclude-from", "--force-local", "-b", "--blocking-factor", "-B",
                            "-i", "--ignore-zeros", "--ignore-case", "--null", "-H", "--format",
                            "--totals", "--transform", "--xform", "--show-transformed-names",
                            "-w", "--help", "--version", "-R", "--block-number"})


def _tar(argv: list[str], *_rest: object) -> _Effect:
    args = argv[1:]
    if args and not args[0].startswith("-"):
        args = ["-" + args[0]] + args[1:]  # `tar xzf a.tgz`
    options, _ = _parse_options(args, _TAR_VALUE)
    names = _names(options)
    archive = _values(options, "-f", "--file")
    directory = _values(options, "-C", "--directory")
    extra = _values(options, "-g", "--listed-incremental", "--index-file", "--volno-file")
    runs = sorted(names & _TAR_RUNS)
    if any(":" in a for a in archive) and "--force-local" not in names:
        runs.append("-f host:file")  # a remote archive: tar runs rsh/ssh
    if names & {"-c", "--create", "-r", "--append", "-u", "--update", "-A", "--concatenate",
                "--delete"}:
        effect = _Effect("write", what="write an archive with tar", targets=archive + extra,
                         writes_cwd=not archive)
    elif names & {"-x", "--extract", "--get"} and not names & {"-O", "--to-stdout"}:
        effect = _Effect("write", what="extract files with tar", targets=directory + extra,
                         writes_cwd=not directory)
    elif extra:
        effect = _Effect("write", what="write files with tar", targets=extra)
    else:
        unknown = [k for k, _ in options if k not in _TAR_READ_SAFE]
        effect = _Effect("read", unsafe=f"run `tar {unknown[0]}`, an option ov does not know"
                         if unknown else "")
    if runs:
        effect.kind = "code"
        effect.what = f"`tar {runs[0]}` (it runs a program)"
        effect.scripts = _values(options, "-I", "--use-compress-program", "--to-command",
                                 "--info-script", "-F", "--new-volume-script")
        effect.scripts += [a.split("=", 1)[1] for a in _values(options, "--checkpoint-action")
                           if a.startswith("exec=")]
    return effect


HANDLERS: dict[str, _Handler] = {
    "sed": _sed,
    "gsed": _sed,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "sort": _sort,
    "tar": _tar,
}

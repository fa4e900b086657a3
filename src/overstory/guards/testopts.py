"""What the options of test runners and linters do: read-only, an output file, or unknown.

Read-only agents may run tests and linters (reviewers need them), but only with options
ov knows to be harmless: ``pytest --basetemp=/elsewhere``, ``mypy --html-report``,
``go test -exec prog`` or ``cargo test --target-dir`` write files or run programs.
Writers may use output options; their paths are checked like any write. Arguments after
``--`` that go on to another tool (``npm test -- …``, ``cargo test -- …``) may only be
plain words for read-only agents, or options from the tool's short ``forwarded`` list.

Imported only when a test runner or linter is called with options beyond the common
ones, so the guard's hot path does not pay for these tables.
"""

from __future__ import annotations

from overstory.guards.effects import _parse_options


class Spec:
    """One tool's options. ``lenient``: every option not in ``outputs``/``unsafe`` is fine
    (tools with hundreds of harmless style options: prettier, tsc, isort, shellcheck).

    A plain class: ``dataclasses`` imports ``re``, which `ov guard` otherwise does without (``guards.chars``)."""

    __slots__ = ("forwarded", "lenient", "outputs", "prefixes", "safe", "single_dash_long", "unsafe", "values")

    def __init__(self, *, safe: frozenset[str] = frozenset(), values: tuple[str, ...] = (),
                 outputs: frozenset[str] = frozenset(), unsafe: frozenset[str] = frozenset(),
                 prefixes: tuple[str, ...] = (), forwarded: frozenset[str] | None = None, lenient: bool = False,
                 single_dash_long: bool = False) -> None:
        self.safe = safe
        self.values = values
        self.outputs = outputs
        self.unsafe = unsafe
        self.prefixes = prefixes
        self.forwarded = forwarded  # options allowed after `--` (None: `--` is pathspec)
        self.lenient = lenient
        self.single_dash_long = single_dash_long  # go: `-run X`, `-count=1`


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_PYTEST_VALUES = ("-k", "-m", "-p", "-c", "-o", "-W", "-r", "-n", "--tb", "--maxfail", "--durations",
                  "--durations-min", "--capture", "--import-mode", "--deselect", "--ignore",
                  "--ignore-glob", "--rootdir", "--confcutdir", "--basetemp", "--junitxml",
                  "--junit-xml", "--junit-prefix", "--log-file", "--log-level", "--log-cli-level",
                  "--log-format", "--log-date-format", "--log-file-level", "--color",
                  "--code-highlight", "--show-capture", "--cov-report", "--cov-fail-under",
                  "--cov-config", "--numprocesses", "--dist", "--timeout", "--count", "--reruns",
                  "--reruns-delay", "--randomly-seed", "--hypothesis-seed", "--hypothesis-profile",
                  "--asyncio-mode", "--result-log", "--resultlog", "--report-log", "--html",
                  "--json-report-file", "--doctest-glob", "--override-ini", "--benchmark-json",
                  "--benchmark-save", "--benchmark-storage")
_PYTEST = Spec(
    safe=_words("""
        -q --quiet -v --verbose -x --exitfirst -s -l --showlocals --lf --last-failed --ff
        --failed-first --nf --new-first --sw --stepwise --sw-skip --stepwise-skip --co
        --collect-only --no-header --no-summary --strict-markers --strict-config --strict
        --runxfail --full-trace --disable-warnings --disable-pytest-warnings --setup-show
        --setup-only --setup-plan --fixtures --funcargs --fixtures-per-test --markers --version
        -V -h --help --doctest-modules --doctest-continue-on-failure
        --continue-on-collection-errors --trace-config --no-cov --no-cov-on-fail --cov-branch
        --cache-show --cache-clear --pyargs --keep-duplicates --noconftest --lfnf
        --last-failed-no-failures --hypothesis-show-statistics --benchmark-disable
        --benchmark-skip --benchmark-only --cov -k -m -p -W -r -n --tb --maxfail --durations
        --durations-min --capture --import-mode --deselect --ignore --ignore-glob --log-level
        --log-cli-level --log-format --log-date-format --color --code-highlight --show-capture
        --cov-fail-under --cov-config --numprocesses --dist --timeout --count --reruns
        --reruns-delay --randomly-seed --hypothesis-seed --hypothesis-profile --asyncio-mode
        --doctest-glob"""),
    values=_PYTEST_VALUES,
    outputs=_words("""--basetemp --junitxml --junit-xml --log-file --result-log --resultlog
                      --report-log --html --json-report-file --benchmark-json --benchmark-storage"""),
)
_MYPY = Spec(
    safe=_words("""-p --package -m --module -v --verbose -V --version -h --help -c --command
                   --config-file --exclude --python-version --platform --always-true
                   --always-false --pretty --explicit-package-bases --namespace-packages
                   --sqlite-cache --cache-fine-grained --skip-version-check --skip-cache-mtime-checks
                   --package-root --shadow-file --scripts-are-modules --junit-format
                   --error-summary --local-partial-types --extra-checks --soft-error-limit
                   --untyped-calls-exclude --exclude-gitignore"""),
    values=("-p", "--package", "-m", "--module", "-c", "--command", "--config-file", "--exclude",
            "--python-version", "--platform", "--always-true", "--always-false", "--cache-dir",
            "--package-root", "--junit-xml", "--html-report", "--txt-report", "--xml-report",
            "--linecount-report", "--linecoverage-report", "--lineprecision-report",
            "--any-exprs-report", "--cobertura-xml-report", "--xslt-html-report",
            "--xslt-txt-report", "--soft-error-limit", "--python-executable"),
    outputs=_words("""--cache-dir --junit-xml --html-report --txt-report --xml-report
                      --linecount-report --linecoverage-report --lineprecision-report
                      --any-exprs-report --cobertura-xml-report --xslt-html-report
                      --xslt-txt-report"""),
    prefixes=("--warn-", "--no-", "--allow-", "--disallow-", "--strict", "--show-", "--hide-",
              "--check-", "--follow-imports", "--ignore-", "--implicit-", "--enable-",
              "--disable-", "--force-", "--color-"),
)
_RUFF_SAFE = _words("""--select --ignore --extend-select --extend-ignore --per-file-ignores
    --extend-per-file-ignores --line-length --target-version --output-format --statistics
    --show-fixes --no-fix -q -s --quiet --silent -v --verbose --exit-zero --exit-non-zero-on-fix
    --preview --no-preview --no-cache --config --isolated --respect-gitignore
    --no-respect-gitignore --force-exclude --no-force-exclude --exclude --extend-exclude
    --show-files --show-settings --diff --fixable --unfixable --extend-fixable
    --dummy-variable-rgx --ignore-noqa --extension --stdin-filename --unsafe-fixes
    --no-unsafe-fixes --check --range -h --help --version -n""")
_RUFF = Spec(
    safe=_RUFF_SAFE,
    values=("--select", "--ignore", "--extend-select", "--extend-ignore", "--per-file-ignores",
            "--extend-per-file-ignores", "--line-length", "--target-version", "--output-format",
            "--config", "--exclude", "--extend-exclude", "--fixable", "--unfixable",
            "--extend-fixable", "--dummy-variable-rgx", "--extension", "--stdin-filename",
            "--cache-dir", "-o", "--output-file", "--range"),
    outputs=_words("--cache-dir -o --output-file"),
)
_BLACK = Spec(
    safe=_words("""-l --line-length -t --target-version -q --quiet -v --verbose --color
                   --no-color -S --skip-string-normalization -C --skip-magic-trailing-comma
                   --preview --unstable --enable-unstable-feature --config --include --exclude
                   --extend-exclude --force-exclude --fast --safe --required-version -W --workers
                   --pyi --ipynb --python-cell-magics --check --diff --line-ranges -x
                   --skip-source-first-line --stdin-filename -c --code -h --help --version"""),
    values=("-l", "--line-length", "-t", "--target-version", "--config", "--include", "--exclude",
            "--extend-exclude", "--force-exclude", "--required-version", "-W", "--workers",
            "--python-cell-magics", "--line-ranges", "--stdin-filename", "-c", "--code",
            "--enable-unstable-feature"),
)
_FLAKE8 = Spec(
    safe=_words("""--max-line-length --max-doc-length --select --ignore --extend-ignore
                   --extend-select --exclude --extend-exclude --filename --per-file-ignores
                   --count --statistics --show-source --no-show-source -q --quiet -v --verbose
                   --max-complexity --format --config --isolated --append-config --jobs -j
                   --benchmark --exit-zero --color --hang-closing --indent-size --disable-noqa
                   --enable-extensions --require-plugins --bug-report --version -h --help
                   --stdin-display-name --doctests --builtins --tee"""),
    values=("--max-line-length", "--max-doc-length", "--select", "--ignore", "--extend-ignore",
            "--extend-select", "--exclude", "--extend-exclude", "--filename", "--per-file-ignores",
            "--max-complexity", "--format", "--config", "--append-config", "--jobs", "-j",
            "--color", "--indent-size", "--enable-extensions", "--require-plugins",
            "--stdin-display-name", "--builtins", "--output-file"),
    outputs=_words("--output-file"),
)
_PYLINT = Spec(
    safe=_words("""-d --disable -e --enable --rcfile -r --reports -s --score -j --jobs -E
                   --errors-only --ignore --ignore-patterns --ignore-paths --max-line-length -v
                   --verbose --exit-zero --fail-under --fail-on --recursive --py-version
                   --load-plugins --source-roots --msg-template --disable-all -h --help --version
                   --generate-rcfile --generate-toml-config --long-help"""),
    values=("-d", "--disable", "-e", "--enable", "--rcfile", "-f", "--output-format", "-r",
            "--reports", "-s", "--score", "-j", "--jobs", "--ignore", "--ignore-patterns",
            "--ignore-paths", "--max-line-length", "--fail-under", "--fail-on", "--recursive",
            "--py-version", "--load-plugins", "--source-roots", "--msg-template", "--output",
            "--init-hook"),
    outputs=_words("--output"),
)
_PYRIGHT = Spec(
    safe=_words("""-p --project --pythonpath --pythonplatform --pythonversion --level --warnings
                   --outputjson --stats --verbose --version -h --help --lib --skipunannotated
                   --verifytypes --ignoreexternal --threads -t --typeshedpath --venvpath"""),
    values=("-p", "--project", "--pythonpath", "--pythonplatform", "--pythonversion", "--level",
            "--verifytypes", "--threads", "-t", "--typeshedpath", "--venvpath", "--createstub"),
)
_LENIENT_NODE = Spec(lenient=True, values=("--cache-location", "--config", "--ignore-path",
                                           "--log-level", "--loglevel", "--plugin", "--parser"),
                     outputs=_words("--cache-location"))
_ESLINT = Spec(lenient=True,
               values=("-c", "--config", "--ext", "-f", "--format", "--max-warnings",
                       "--ignore-path", "--ignore-pattern", "--rule", "--env", "--global",
                       "--parser", "--parser-options", "--plugin", "--resolve-plugins-relative-to",
                       "--rulesdir", "-o", "--output-file", "--cache-location", "--cache-file",
                       "--stdin-filename", "--fix-type", "--flag"),
               outputs=_words("-o --output-file --cache-location --cache-file"))
_TSC = Spec(lenient=True, values=("--generateTrace", "--tsBuildInfoFile", "-p", "--project"),
            outputs=_words("--generateTrace --tsBuildInfoFile"),
            unsafe=_words("-b --build --init -w --watch --generateCpuProfile"))
_TOX = Spec(
    safe=_words("""-e --env -p --parallel -q --quiet -v --verbose -r --recreate --notest -l
                   --list-envs -a --listenvs-all --skip-missing-interpreters --colored
                   --hashseed --no-provision -h --help --version --develop --sitepackages"""),
    values=("-e", "--env", "-p", "--parallel", "--colored", "--hashseed", "-c", "--conf",
            "--workdir", "--root", "-x", "--override", "--installpkg", "--result-json",
            "--skip-missing-interpreters"),
    outputs=_words("--workdir --result-json"),
    forwarded=frozenset(),
)
_NOX = Spec(
    safe=_words("""-s --session --sessions -k -t --tags -p --python -r
                   --reuse-existing-virtualenvs -R -x --stop-on-first-error -l --list
                   --list-sessions -v --verbose --error-on-missing-interpreters
                   --no-error-on-missing-interpreters --force-color --no-color --json
                   --default-venv-backend -db --force-venv-backend -fb --no-venv --non-interactive
                   --add-timestamp -h --help --version --no-reuse-existing-virtualenvs"""),
    values=("-s", "--session", "--sessions", "-k", "-t", "--tags", "-p", "--python",
            "--default-venv-backend", "-db", "--force-venv-backend", "-fb", "-f", "--noxfile",
            "--envdir", "--report"),
    outputs=_words("--envdir --report"),
    forwarded=frozenset(),
)
_MAKE = Spec(
    safe=_words("""-j --jobs -k --keep-going -s --silent --quiet --no-print-directory -w
                   --print-directory -O --output-sync -l --load-average
                   --warn-undefined-variables -B --always-make -r --no-builtin-rules -R
                   --no-builtin-variables -S --no-keep-going --stop -i --ignore-errors"""),
    values=("-j", "--jobs", "-O", "--output-sync", "-l", "--load-average", "-C", "--directory",
            "-f", "--file", "--makefile", "-I", "--include-dir", "-o", "--old-file", "-W",
            "--what-if", "--assume-new", "--new-file", "--eval", "-E"),
)
_NODE_TEST = Spec(
    safe=_words("-s --silent -q --quiet --if-present --loglevel --no-color --color"),
    values=("--loglevel", "--color", "--prefix", "-C", "--dir", "--script-shell", "--userconfig",
            "--globalconfig", "-w", "--workspace"),
    forwarded=frozenset(),
)
_CARGO = Spec(
    safe=_words("""-p --package --lib --bins --bin --tests --test --benches --bench --examples
                   --example --all-targets --doc --workspace --all --exclude -F --features
                   --all-features --no-default-features --release -r --profile -j --jobs -q
                   --quiet -v --verbose -vv --color --locked --offline --frozen --no-fail-fast
                   --no-run --message-format --target --timings --keep-going
                   --future-incompat-report --ignore-rust-version --check -h --help
                   --no-deps --tests"""),
    values=("-p", "--package", "--bin", "--test", "--bench", "--example", "--exclude", "-F",
            "--features", "--profile", "-j", "--jobs", "--color", "--message-format", "--target",
            "--target-dir", "--manifest-path", "--config", "-Z", "--artifact-dir", "--out-dir",
            "--lockfile-path"),
    outputs=_words("--target-dir --artifact-dir --out-dir"),
    forwarded=_words("""--nocapture --test-threads --exact --ignored --include-ignored -q --quiet
                        --show-output --skip --list --format --color -D -W -A -F --deny --warn
                        --allow --forbid --check"""),
)
_GO = Spec(
    safe=_words("""v run skip count race short timeout bench benchtime benchmem cover covermode
                   coverpkg cpu failfast json list p parallel shuffle tags mod trimpath vet
                   fullpath x n a buildvcs work asan msan h help"""),
    values=("run", "skip", "count", "timeout", "bench", "benchtime", "covermode", "coverpkg",
            "cpu", "list", "p", "parallel", "shuffle", "tags", "mod", "vet", "o", "coverprofile",
            "cpuprofile", "memprofile", "blockprofile", "mutexprofile", "trace", "outputdir",
            "exec", "toolexec", "vettool", "overlay", "modfile", "pgo", "gcflags", "ldflags",
            "asmflags", "gccgoflags", "compiler", "pkgdir", "buildmode"),
    outputs=_words("o coverprofile cpuprofile memprofile blockprofile mutexprofile trace outputdir"),
    single_dash_long=True,
)

SPECS: dict[str, Spec] = {
    "pytest": _PYTEST, "mypy": _MYPY, "ruff": _RUFF, "black": _BLACK, "flake8": _FLAKE8,
    "pylint": _PYLINT, "pyright": _PYRIGHT, "prettier": _LENIENT_NODE, "eslint": _ESLINT,
    "tsc": _TSC, "tox": _TOX, "nox": _NOX, "make": _MAKE, "npm": _NODE_TEST, "cargo": _CARGO,
    "go": _GO, "isort": Spec(lenient=True, values=("--settings-path", "--sp", "--settings-file")),
    "shellcheck": Spec(lenient=True),
}


def inspect(tool: str, args: list[str], *, read_only: bool) -> tuple[list[str], str]:
    """(files the options write, why a read-only agent may not run this or "")."""
    spec = SPECS.get(tool)
    if spec is None:
        return [], ""
    before, forwarded = args, []
    if "--" in args and spec.forwarded is not None:
        cut = args.index("--")
        before, forwarded = args[:cut], args[cut + 1 :]
    if spec.single_dash_long:
        options = _go_options(before, spec.values)
        positionals: list[str] = []
    else:
        options, positionals = _parse_options(before, spec.values)
    targets: list[str] = []
    unsafe = ""
    for key, value in options:
        if key in spec.outputs:
            if value and value != "/dev/null":
                targets.append(value)
                unsafe = unsafe or f"run `{tool} {key}`, which writes {value}"
        elif key in spec.unsafe or not (spec.lenient or key in spec.safe
                                         or key.startswith(spec.prefixes or ("\0",))):
            unsafe = unsafe or f"run `{tool} {key}`, an option ov does not know to be read-only"
    if tool == "make" and any("=" in p for p in positionals):
        unsafe = unsafe or "override make variables (they can change the commands make runs)"
    if tool == "pytest":
        for key, value in options:
            if key == "--cov-report" and value and not value.startswith("term"):
                unsafe = unsafe or f"run `pytest --cov-report={value}`, which writes a report"
                if ":" in value:
                    targets.append(value.split(":", 1)[1])
    for arg in forwarded:
        if arg.startswith("-") and arg.split("=", 1)[0] not in (spec.forwarded or ()):
            unsafe = unsafe or (f"pass `{arg}` on to the tests after `--`, an option ov does not "
                                "know to be read-only")
    return targets, unsafe if read_only else ""


def _go_options(args: list[str], values: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """go's flags: one or two dashes, ``-name=value`` or ``-name value``; ``-args`` ends them."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-args", "--args"):
            options.extend((a, None) for a in args[i + 1 :] if a.startswith("-"))
            break
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.lstrip("-").partition("=")
            if not eq and name in values and i + 1 < len(args):
                value = args[i + 1]
                i += 1
            options.append((name, value if (eq or name in values) else None))
        i += 1
    return options

"""The ledger's classes of tool call, its normalized input and idempotency key (ARCHITECTURE §13).

- ``read``: changes nothing (Read, Grep, Glob, ``git log``, ``ls`` …).
- ``local_write``: changes the agent's own worktree or ov's local state (Write, Edit,
  ``git commit``, test runs …). Its effect shows in git, so a replay does not duplicate it.
- ``side_effect``: leaves the machine or touches shared state (``git push``, ``gh pr
  create``, ``curl -X POST``, package publishing, MCP tools not known to be read-only,
  ``ov mail send``, ``ov sling``, ``ov merge`` …).

The rules are tool patterns (``guards.patterns``), tried in order, first match wins:
config ``ledger.read_only``, config ``ledger.side_effects``, then ``DEFAULT_RULES``.
A shell command line gets the highest class of its simple commands, each classified on
its own; a command that matches nothing is a ``local_write``, and so is one that
redirects output into a file. Standard library only (``ov guard`` runs it on every call).
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # collections.abc's classes, without importing the collections package

from overstory import jsontext
from overstory.guards.patterns import SHELL_TOOLS, ToolPattern, call_subjects, parse_pattern, shell_commands

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Sequence

READ = "read"
LOCAL_WRITE = "local_write"
SIDE_EFFECT = "side_effect"
CLASSES = (READ, LOCAL_WRITE, SIDE_EFFECT)
_RANK = {READ: 0, LOCAL_WRITE: 1, SIDE_EFFECT: 2}
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})

_GH_READS = ("pr view", "pr list", "pr diff", "pr status", "pr checks", "issue view", "issue list",
             "issue status", "repo view", "run view", "run list", "release list", "release view",
             "search *", "auth status")
_PUBLISH = ("npm publish", "npm unpublish", "npm deprecate", "yarn publish", "yarn npm publish", "pnpm publish",
            "twine upload", "cargo publish", "cargo yank", "gem push", "poetry publish", "uv publish",
            "flit publish", "hatch publish", "docker push", "podman push", "helm push", "kubectl apply",
            "kubectl create", "kubectl delete", "kubectl patch", "terraform apply", "terraform destroy")
_OV_EFFECTS = ("ov mail send", "ov mail reply", "ov nudge", "ov sling", "ov merge", "ov stop", "ov coordinator")
#: Programs that only read (any arguments), checked after the rules.
READ_PROGRAMS = frozenset((
    "cat ls head tail wc grep egrep fgrep rg ag echo printf pwd which type file stat du df diff cmp comm cut tr "
    "sort uniq basename dirname realpath readlink jq tree true false test [ [[ sleep md5sum sha256sum ps env "
    "date whoami id uname printenv nproc cd pushd popd"
).split())
_GIT_READS = ("status", "log", "diff", "show", "rev-parse", "blame", "ls-files", "ls-tree", "ls-remote", "describe",
              "grep", "shortlog", "cat-file", "rev-list", "show-ref", "for-each-ref", "merge-base", "reflog",
              "stash list", "stash show", "worktree list")
_GIT_EXACT_READS = ("branch", "branch -a", "branch -v*", "branch --list*", "branch --show-current", "remote",
                    "remote -v", "remote show*", "remote get-url*", "config --get*", "config -l*", "config --list*")
_OV_READS = ("ov status", "ov mail list", "ov trace", "ov logs", "ov feed", "ov tree", "ov run list", "ov run show",
             "ov doctor", "ov config", "ov --version", "ov --help")

#: (pattern, class) in order; the first match wins. Config rules come before these.
DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    *((f"Bash(gh {form}*)", READ) for form in _GH_READS),
    ("Bash(gh api *)", READ),  # unless it sends data: see _sends_data
    ("Bash(gh *)", SIDE_EFFECT),
    ("Bash(git push*)", SIDE_EFFECT),
    ("Bash(git send-email*)", SIDE_EFFECT),
    ("Bash(git svn dcommit*)", SIDE_EFFECT),
    *((f"Bash({command}*)", SIDE_EFFECT) for command in _PUBLISH),
    ("Bash(ssh *)", SIDE_EFFECT),
    ("Bash(scp *)", SIDE_EFFECT),
    *((f"Bash({command}*)", SIDE_EFFECT) for command in _OV_EFFECTS),
    *((f"Bash({command}*)", READ) for command in _OV_READS),
    *((f"Bash(git {form})", READ) for form in _GIT_READS),
    *((f"Bash(git {form} *)", READ) for form in _GIT_READS),
    *((f"Bash(git {form})", READ) for form in _GIT_EXACT_READS),
    ("Bash(find *-delete*)", LOCAL_WRITE),
    ("Bash(find *-exec*)", LOCAL_WRITE),
    ("Bash(find*)", READ),
    ("mcp__*", SIDE_EFFECT),
    ("WebFetch", READ),
    ("WebSearch", READ),
    ("Read", READ), ("Grep", READ), ("Glob", READ), ("LS", READ), ("NotebookRead", READ),
    ("ToolSearch", READ), ("ListAgents", READ), ("TodoRead", READ), ("BashOutput", READ),
)
_DEFAULTS = tuple((parse_pattern(text), klass) for text, klass in DEFAULT_RULES)

# curl/wget/httpie calls that send data or use a method other than GET/HEAD.
_HTTP_PROGRAMS = frozenset({"curl", "wget", "http", "https", "xh"})
_HTTP_WRITE = (  # compiled on the first HTTP call (``_http_write``): the guard's other calls need not pay for it
    r"(^|\s)(-X\s*|--request[=\s]+|--method[=\s]+)(?!(GET|HEAD|OPTIONS)\b)[A-Z]+\b"
    r"|(^|\s)(-d|--data\S*|-F|--form\S*|-T|--upload-file|--json|--post-data\S*|--post-file\S*|--body-data\S*)(\s|=|$)"
    r"|(^|\s)(POST|PUT|PATCH|DELETE)\s+\S"
)


def _http_write(subject: str) -> bool:
    import re  # only for an HTTP call: `ov guard` does not import re for the others

    return re.search(_HTTP_WRITE, subject) is not None  # re's own cache keeps the compiled pattern


class LedgerRules:
    """The configured rules (``ledger.read_only`` and ``ledger.side_effects``) ahead of the defaults."""

    __slots__ = ("_by_tool", "_ordered", "read_only", "side_effects")

    def __init__(self, read_only: tuple[ToolPattern, ...] = (), side_effects: tuple[ToolPattern, ...] = ()) -> None:
        self.read_only = read_only
        self.side_effects = side_effects
        self._ordered = (*((p, READ) for p in read_only), *((p, SIDE_EFFECT) for p in side_effects), *_DEFAULTS)
        self._by_tool: dict[str, tuple[tuple[ToolPattern, str], ...]] = {}

    @classmethod
    def from_texts(cls, read_only: Sequence[str] = (), side_effects: Sequence[str] = ()) -> LedgerRules:
        return cls(tuple(parse_pattern(t) for t in read_only), tuple(parse_pattern(t) for t in side_effects))

    def ordered(self) -> tuple[tuple[ToolPattern, str], ...]:
        return self._ordered

    def for_tool(self, tool: str) -> tuple[tuple[ToolPattern, str], ...]:
        """The rules whose tool matches ``tool``, in order (worked out once per tool)."""
        found = self._by_tool.get(tool)
        if found is None:
            found = self._by_tool[tool] = tuple((p, klass) for p, klass in self._ordered if p.tool_matches(tool))
        return found


DEFAULT_LEDGER_RULES = LedgerRules()


def classify(tool: str, tool_input: Mapping[str, object] | None, rules: LedgerRules = DEFAULT_LEDGER_RULES) -> str:
    """``read``, ``local_write`` or ``side_effect`` for one tool call."""
    ordered = rules.for_tool(tool)
    if tool in SHELL_TOOLS:
        command = (tool_input or {}).get("command")
        if not isinstance(command, str):
            return _class_of_subject(tool, None, ordered) or LOCAL_WRITE
        best = READ
        for words, redirects in shell_commands(command):
            klass = _class_of_subject(tool, " ".join(words), ordered)
            if words and os.sep in words[0]:  # as written first (``./deploy.sh``), then by base name
                words = [os.path.basename(words[0]), *words[1:]]
            subject = " ".join(words)
            klass = klass or _class_of_subject(tool, subject, ordered) or (
                READ if words and words[0] in READ_PROGRAMS else LOCAL_WRITE)
            if klass != SIDE_EFFECT and _sends_data(words, subject):
                klass = SIDE_EFFECT
            if klass == READ and any(op in _WRITE_REDIRECTS and target not in ("/dev/null", "/dev/stderr",
                                                                              "/dev/stdout")
                                     for op, target in redirects):
                klass = LOCAL_WRITE
            if _RANK[klass] > _RANK[best]:
                best = klass
        return best
    subjects = call_subjects(tool, tool_input)
    for pattern, klass in ordered:
        if pattern.argument is None or any(pattern.subject_matches(s) for s in subjects):
            return klass
    return LOCAL_WRITE


#: Calls that are ``local_write`` by design, with no rule needed (for ``unplaced``: not "unknown").
LOCAL_WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit", "TodoWrite"})
_GIT_LOCAL_WRITES = frozenset("add commit checkout switch restore reset rm mv stash merge rebase cherry-pick tag "
                              "init apply am revert clean worktree branch".split())


def unplaced(tool: str, tool_input: Mapping[str, object] | None,
             rules: LedgerRules = DEFAULT_LEDGER_RULES) -> list[str]:
    """What no rule placed in a class (``classify`` made it a ``local_write`` by default): the tool itself, or
    for a shell call each simple command that matched no rule and is not a known read-only program.
    For `ov policy audit`, to tune ``ledger.read_only``/``ledger.side_effects``."""
    ordered = rules.for_tool(tool)
    if tool not in SHELL_TOOLS:
        subjects = call_subjects(tool, tool_input)
        known = any(pattern.argument is None or any(pattern.subject_matches(s) for s in subjects)
                    for pattern, _ in ordered)
        return [] if known or tool in LOCAL_WRITE_TOOLS else [tool]
    command = (tool_input or {}).get("command")
    if not isinstance(command, str):
        return [] if _class_of_subject(tool, None, ordered) else [tool]
    found = []
    for words, _redirects in shell_commands(command):
        if not words or _class_of_subject(tool, " ".join(words), ordered):
            continue
        if os.sep in words[0]:
            words = [os.path.basename(words[0]), *words[1:]]
        if words[0] in READ_PROGRAMS or (words[0] == "git" and words[1:2] and words[1] in _GIT_LOCAL_WRITES):
            continue
        if not _class_of_subject(tool, " ".join(words), ordered):
            found.append(" ".join(words))
    return found


#: Side effects that are idempotent by themselves inside an agent's turn (keyed by the dispatch, see
#: ``store.dispatch``): running one again returns the first one's result instead of repeating it.
IDEMPOTENT_COMMANDS = ("ov mail send", "ov mail reply", "ov sling")


def reruns_safely(tool: str, tool_input: Mapping[str, object] | None,
                  rules: LedgerRules = DEFAULT_LEDGER_RULES) -> bool:
    """True when every side effect of a shell call is one of ``IDEMPOTENT_COMMANDS``.

    Such a call may simply run again when it is not known whether its first run happened:
    the command itself makes sure it happens once.
    """
    command = (tool_input or {}).get("command")
    if tool not in SHELL_TOOLS or not isinstance(command, str):
        return False
    found = False
    for words, _redirects in shell_commands(command):
        if words and os.sep in words[0]:
            words = [os.path.basename(words[0]), *words[1:]]
        subject = " ".join(words)
        if classify(tool, {"command": subject}, rules) != SIDE_EFFECT:
            continue
        if not any(subject == c or subject.startswith(c + " ") for c in IDEMPOTENT_COMMANDS):
            return False
        found = True
    return found


def _sends_data(words: list[str], subject: str) -> bool:
    """curl/wget/httpie with a body or a method other than GET/HEAD, and ``gh api`` that writes."""
    if not words:
        return False
    if words[0] in _HTTP_PROGRAMS:
        return _http_write(subject)
    if words[0] == "gh" and words[1:2] == ["api"]:
        return _http_write(subject) or any(
            w.split("=", 1)[0] in ("-f", "-F", "--field", "--raw-field", "--input") for w in words[2:])
    return False


def _class_of_subject(tool: str, subject: str | None, ordered: tuple[tuple[ToolPattern, str], ...]) -> str | None:
    """The class of the first of ``ordered`` (``LedgerRules.for_tool(tool)``: its tool matches) that matches."""
    for pattern, klass in ordered:
        if pattern.argument is None or (subject is not None and pattern.subject_matches(subject)):
            return klass
    return None


# --------------------------------------------------------------------------- normalized input and key

#: Input fields that do not change what a call does (the model may word them differently on a replay).
COSMETIC_FIELDS: dict[str, frozenset[str]] = {"Bash": frozenset({"description"})}


def normalize_input(tool: str, tool_input: Mapping[str, object] | None, worktree: str | None) -> str:
    """Stable JSON of the input: sorted keys, cosmetic fields dropped, worktree paths made relative."""
    skip = COSMETIC_FIELDS.get(tool, frozenset())
    cleaned = {k: v for k, v in (tool_input or {}).items() if k not in skip}
    roots: list[str] = []
    if worktree:
        roots = sorted({worktree.rstrip(os.sep), os.path.realpath(worktree).rstrip(os.sep)}, key=len, reverse=True)
    return jsontext.dumps(_relative(cleaned, roots), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def _relative(value: object, roots: list[str]) -> object:
    if isinstance(value, str):
        for root in roots:
            if value == root:
                return "."
            value = value.replace(root + os.sep, "")
        return value
    if isinstance(value, Mapping):
        return {str(k): _relative(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_relative(v, roots) for v in value]
    return value


def idempotency_key(*, agent: str, task: str, klass: str, tool: str, normalized: str, scope: str) -> str:
    """hash(agent, task, class, tool, normalized input), scoped to the dispatch the turn answers."""
    material = jsontext.dumps([agent, task, klass, tool, normalized, scope], separators=(",", ":"), ensure_ascii=False)
    return _sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


try:  # the built-in module, without hashlib's OpenSSL start-up (a few ms on every `ov guard`)
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - other Pythons
    from hashlib import sha256 as _sha256

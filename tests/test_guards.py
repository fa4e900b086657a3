"""Tool-call guards (`ov guard`, ARCHITECTURE §10): a table of calls, the CLI, the import cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import overstory
from overstory import guards
from overstory.cli.guard import guard

SRC_DIR = str(Path(overstory.__file__).resolve().parent.parent)
HOME = "/nonexistent-home/agent"  # outside the temp dir, so writes there must be refused

AGENTS: dict[str, str | None] = {
    "builder-a": "builder",
    "builder-b": "builder",
    "merger-m": "merger",
    "scout-1": "scout",
    "reviewer-r": "reviewer",
    "lead-l": "lead",
    "monitor-w": "monitor",
    "wizard-z": "wizard",  # a capability guards do not know: treated as read-only
    "coordinator": "coordinator",  # no worktree of its own: runs at the project root
    "builder-lost": "builder",  # a writer whose OVERSTORY_WORKTREE is missing
    "operator": None,  # not inside an agent at all
}
WORKTREE_AGENTS = ["builder-a", "builder-b", "merger-m", "scout-1", "reviewer-r", "lead-l",
                   "monitor-w", "wizard-z"]


class Project(NamedTuple):
    root: Path

    def worktree(self, agent: str) -> Path:
        return self.root / ".overstory" / "worktrees" / agent

    def env(self, agent: str) -> dict[str, str]:
        capability = AGENTS[agent]
        if capability is None:
            return {"HOME": HOME, "PATH": os.environ.get("PATH", "")}
        env = {
            "HOME": HOME,
            "OVERSTORY_AGENT_NAME": agent,
            "OVERSTORY_CAPABILITY": capability,
            "OVERSTORY_PROJECT_ROOT": str(self.root),
        }
        if agent in WORKTREE_AGENTS:
            env["OVERSTORY_WORKTREE"] = str(self.worktree(agent))
        return env

    def start_dir(self, agent: str) -> Path:
        return self.worktree(agent) if agent in WORKTREE_AGENTS else self.root

    def fill(self, value: Any, agent: str) -> Any:
        """Replace {root}, {wt}, {other}, {home} placeholders in strings, recursively."""
        if isinstance(value, str):
            return (value.replace("{root}", str(self.root))
                    .replace("{wt}", str(self.start_dir(agent)))
                    .replace("{other}", str(self.worktree("builder-b")))
                    .replace("{home}", HOME))
        if isinstance(value, dict):
            return {k: self.fill(v, agent) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v, agent) for v in value]
        return value


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                   cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """A real repository with real git worktrees for each agent, plus two escape symlinks."""
    root = tmp_path_factory.mktemp("guarded").resolve() / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "README.md").write_text("hello\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "initial")
    (root / ".overstory").mkdir()
    (root / ".overstory" / "state.db").write_bytes(b"")
    for agent in WORKTREE_AGENTS:
        _git(root, "worktree", "add", "-q", "-b", f"ov/{agent}",
             str(root / ".overstory" / "worktrees" / agent))
    builder = root / ".overstory" / "worktrees" / "builder-a"
    (builder / "escape").symlink_to("/etc")
    (builder / "peek").symlink_to(root / ".overstory" / "worktrees" / "builder-b")
    (builder / "build").mkdir()
    merger = root / ".overstory" / "worktrees" / "merger-m"  # has the hook settings ov writes
    (merger / ".claude").mkdir()
    (merger / ".claude" / "settings.local.json").write_text("{}")
    return Project(root)


def hook_input(project: Project, agent: str, tool: str, tool_input: dict[str, Any],
               cwd: str = "{wt}") -> dict[str, Any]:
    return {
        "session_id": "sess-1",
        "transcript_path": "/dev/null",
        "cwd": project.fill(cwd, agent),
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": project.fill(tool_input, agent),
        "tool_use_id": "toolu_1",
    }


class Case(NamedTuple):
    test_id: str
    agent: str
    tool: str
    tool_input: dict[str, Any]
    allowed: bool
    reason_has: str = ""
    cwd: str = "{wt}"
    extra_env: dict[str, str] | None = None  # on top of the agent's environment


def bash(test_id: str, agent: str, command: str, allowed: bool, reason_has: str = "",
         cwd: str = "{wt}", env: dict[str, str] | None = None) -> Case:
    return Case(test_id, agent, "Bash", {"command": command}, allowed, reason_has, cwd, env)


# `guards.push_remotes: [origin]` as the turn runner exports it: writers may push their own branch there.
PUSH_TO_ORIGIN = {"OVERSTORY_PUSH_REMOTES": "origin", "OVERSTORY_BRANCH": "ov/builder-a"}


def push(test_id: str, command: str, allowed: bool, reason_has: str = "", agent: str = "builder-a") -> Case:
    return bash(test_id, agent, command, allowed, reason_has,
                env={**PUSH_TO_ORIGIN, "OVERSTORY_BRANCH": f"ov/{agent}"})


# The refusal branches one by one: pushes with a remote configured, writing options of programs
# that otherwise only read, installers that write outside the worktree, and changes to the machine.
REFUSALS = [
    push("push-own-branch", "git push origin ov/builder-a", True),
    push("push-own-head", "git push -u origin HEAD", True),
    push("push-own-refspec", "git push origin HEAD:refs/heads/ov/builder-a", True),
    push("esc-push-force-flag", "git push --force origin ov/builder-a", False, "`git push --force` is refused"),
    push("esc-push-force-with-lease", "git push --force-with-lease origin ov/builder-a", False,
         "is refused for every agent"),
    push("esc-push-plus-refspec", "git push origin +ov/builder-a", False, "force pushes are refused"),
    push("esc-push-delete-refspec", "git push origin :ov/builder-a", False, "deletes a remote branch"),
    push("esc-push-delete-flag", "git push --delete origin ov/builder-a", False, "`git push --delete`"),
    push("esc-push-other-branch", "git push origin main", False, "that is not builder-a (builder)'s own"),
    push("esc-push-head-to-other", "git push origin HEAD:main", False, "that is not builder-a (builder)'s own"),
    push("esc-push-tag", "git push origin v1.0", False, "that is not builder-a (builder)'s own"),
    push("esc-push-unlisted-remote", "git push upstream ov/builder-a", False,
         "'upstream' is not a remote agents may push to"),
    push("esc-push-url", "git push https://example.invalid/r.git ov/builder-a", False,
         "is not a remote agents may push to"),
    push("esc-push-bare", "git push", False, "name the remote and the branch"),
    push("esc-push-all", "git push --all origin", False, "`git push --all`"),
    push("esc-push-mirror", "git push --mirror origin", False, "`git push --mirror`"),
    push("esc-push-read-only-agent", "git push origin ov/scout-1", False, "nobody pushes", agent="scout-1"),
    bash("wget-into-worktree", "builder-a", "wget -O {wt}/page.html http://127.0.0.1/", True),
    bash("esc-wget-out-of-worktree", "builder-a", "wget -O /etc/x http://127.0.0.1/", False,
         "may only write inside its worktree"),
    bash("esc-wget-long-option", "builder-a", "wget --output-document=/etc/x http://127.0.0.1/", False,
         "/etc/x is outside it"),
    bash("wget-to-stdout-scout", "scout-1", "wget -q -O - http://127.0.0.1/", True),
    bash("esc-wget-scout", "scout-1", "wget http://127.0.0.1/", False, "download into a file"),
    bash("perl-i-in-worktree", "builder-a", "perl -i -pe s/a/b/ README.md", True),
    bash("esc-perl-i-outside", "builder-a", "perl -i.bak -pe s/a/b/ /etc/hosts", False, "/etc/hosts is outside"),
    bash("esc-perl-i-scout", "scout-1", "perl -i -pe s/a/b/ README.md", False, "`perl -i`"),
    bash("esc-yq-i-outside", "builder-a", "yq eval -i .a=1 /etc/x.yaml", False, "/etc/x.yaml is outside"),
    bash("esc-yq-i-scout", "scout-1", "yq -i .a=1 x.yaml", False, "`yq -i`"),
    bash("xxd-dump-scout", "scout-1", "xxd README.md", True),
    bash("esc-xxd-out-scout", "scout-1", "xxd -r dump out.bin", False, "`xxd IN OUT`"),
    bash("esc-xxd-out-outside", "builder-a", "xxd -r dump /etc/out.bin", False, "/etc/out.bin is outside"),
    bash("esc-uv-tool-install", "builder-a", "uv tool install ruff", False, "`uv tool install` installs outside"),
    bash("uv-pip-into-venv", "builder-a", "uv pip install requests", True),
    bash("esc-uv-pip-system", "builder-a", "uv pip install --system requests", False, "writes to the system"),
    bash("esc-pipx-install", "builder-a", "pipx install ruff", False, "`pipx install`"),
    bash("esc-pipx-run", "builder-a", "pipx run ruff", False, "`pipx run`"),
    bash("esc-gem-install", "builder-a", "gem install rails", False, "`gem install`"),
    bash("gem-list", "builder-a", "gem list", True),
    bash("esc-conda-install", "builder-a", "conda install numpy", False, "`conda install`"),
    bash("esc-conda-create", "builder-a", "conda create -p ./env", False, "`conda create`"),
    bash("date-reads", "scout-1", "date +%s", True),
    bash("esc-date-set-writer", "builder-a", "date -s 2020-01-01", False, "set the system clock"),
    bash("esc-date-set-long", "scout-1", "date --set=2020-01-01", False, "set the system clock"),
    bash("esc-timedatectl", "builder-a", "timedatectl set-time 2020-01-01", False, "set the system clock"),
    bash("timedatectl-status", "scout-1", "timedatectl", True),
    bash("hostname-reads", "scout-1", "hostname", True),
    bash("esc-hostname-set", "builder-a", "hostname evil", False, "set the host name"),
    bash("esc-reboot", "builder-a", "reboot", False, "reboot the machine"),
    bash("esc-reboot-wrapped", "builder-a", "env reboot", False, "reboot the machine"),
    bash("esc-reboot-substituted", "builder-a", "echo $(shutdown now)", False, "shut the machine down"),
    bash("esc-systemctl-stop", "builder-a", "systemctl stop ssh", False, "start, stop or change services"),
    bash("systemctl-status", "scout-1", "systemctl status ssh", True),
    bash("esc-service-stop", "builder-a", "service ssh stop", False, "start, stop or change services"),
    bash("esc-mount", "builder-a", "mount /dev/sda1 /mnt", False, "mount file systems"),
    bash("mount-lists", "scout-1", "mount -t ext4", True),
    bash("esc-umount", "builder-a", "umount /mnt", False, "unmount file systems"),
    bash("esc-sysctl-write", "builder-a", "sysctl -w net.ipv4.ip_forward=1", False, "change kernel settings"),
    bash("sysctl-reads", "scout-1", "sysctl kernel.hostname", True),
    bash("esc-modprobe", "builder-a", "modprobe dummy", False, "kernel modules"),
    bash("esc-useradd", "builder-a", "useradd mallory", False, "add users"),
    bash("esc-iptables-flush", "builder-a", "iptables -F", False, "change the firewall"),
    bash("iptables-lists", "scout-1", "iptables -L -n -t nat", True),
]


def write(test_id: str, agent: str, path: str, allowed: bool, reason_has: str = "",
          tool: str = "Write", cwd: str = "{wt}") -> Case:
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    return Case(test_id, agent, tool, {key: path, "content": "x"}, allowed, reason_has, cwd)


COMMIT_HEREDOC = """git commit -q -m "$(cat <<'EOF'
Fix the parser (really)

It said "done" too early; `now` it waits.
EOF
)" """

# Issue 12: every escape the guard must refuse (and the ordinary forms next to them that
# must keep working). Grouped by kind; each row names the agent (its capability), the
# decision, and a fragment of the reason the model sees.
ESCAPES: list[Case] = [
    # ---- git: global options and environment are refused before any read/write rule
    bash("esc-git-exec-path-reset", "builder-a", "git --exec-path={wt} reset --hard HEAD~1",
         False, "--exec-path"),
    bash("esc-git-exec-path-read", "scout-1", "git --exec-path=/tmp log", False, "--exec-path"),
    bash("git-exec-path-prints", "scout-1", "git --exec-path", True),
    bash("esc-git-dir", "builder-a", "git --git-dir={root}/.git reset --soft HEAD~1", False,
         "--git-dir"),
    bash("esc-git-work-tree", "builder-a", "git --work-tree={root} checkout -- .", False,
         "--work-tree"),
    bash("esc-git-config-option", "builder-a", "git -c core.hooksPath=/tmp/h commit -m x", False,
         "core.hooksPath"),
    bash("esc-git-config-env", "builder-a", "git --config-env=core.pager=PAGER log", False,
         "--config-env"),
    bash("esc-git-unknown-global", "scout-1", "git --frobnicate log", False, "git option"),
    bash("esc-git-dir-env", "builder-a", "GIT_DIR={root}/.git git commit -am x", False,
         "GIT_DIR"),
    bash("esc-git-dir-env-wrapper", "builder-a", "env GIT_DIR={root}/.git git commit -am x",
         False, "GIT_DIR"),
    bash("esc-git-work-tree-export", "builder-a", "export GIT_WORK_TREE={root}; git checkout -- .",
         False, "GIT_WORK_TREE"),
    bash("esc-git-external-diff", "scout-1", "GIT_EXTERNAL_DIFF=/tmp/x.sh git diff", False,
         "GIT_EXTERNAL_DIFF"),
    bash("esc-git-editor", "builder-a", "GIT_EDITOR='touch {root}/x;' git commit", False,
         "GIT_EDITOR"),
    bash("git-harmless-env", "builder-a", "GIT_PAGER=cat git log && GIT_EDITOR=true git commit "
         "--amend", True),
    bash("esc-git-C-checkout", "builder-a", "git -C {root} status", False, "project checkout"),
    bash("esc-git-C-other", "scout-1", "git -C {other} log", False, "builder-b's worktree"),
    bash("esc-git-cd-tmp-read-only", "scout-1", "cd /tmp && git status", False,
         "outside its worktree"),
    bash("git-C-tmp-writer", "builder-a", "git -C /tmp/scratch-repo init", True),
    bash("git-C-own-subdir", "scout-1", "git -C src log --oneline -3", True),
    bash("esc-git-alias", "builder-a", "git st", False, "alias"),
    bash("esc-git-alias-read-only", "scout-1", "git lg", False, "alias"),
    bash("esc-git-config-alias", "builder-a", "git config alias.st '!touch {root}/x'", False,
         "shared"),
    bash("esc-git-config-hooks-path", "builder-a", "git config --worktree core.hooksPath hooks",
         False, "core.*"),
    bash("esc-git-config-include", "builder-a", "git config --worktree include.path /tmp/x",
         False, "include.*"),
    bash("esc-git-config-file", "builder-a", "git config -f {root}/.git/config --worktree "
         "user.name x", False, "shared"),
    bash("git-config-worktree-user", "builder-a", "git config --worktree user.name bot", True),
    bash("esc-git-upload-pack", "builder-a", "git ls-remote --upload-pack='touch {root}/x' .",
         False, "run a program"),
    bash("esc-git-rebase-exec", "builder-a", "git rebase -x 'touch {root}/x' HEAD~1", False,
         "project checkout"),
    bash("esc-git-diff-output", "builder-a", "git diff --output={root}/x", False,
         "project checkout"),
    bash("esc-git-diff-output-read-only", "scout-1", "git diff --output=/tmp/d.txt", False,
         "--output"),
    bash("esc-git-checkout-index-prefix", "builder-a", "git checkout-index -a --prefix={root}/",
         False, "project checkout"),
    bash("esc-git-grep-pager", "builder-a", "git grep -O'touch {root}/x' TODO", False,
         "project checkout"),
    bash("esc-git-bisect-run", "builder-a", "git bisect run rm -rf {root}/src", False,
         "project checkout"),
    # ---- hook settings: removing .claude/ (the merger's worktree has them)
    bash("esc-rm-claude-dir", "merger-m", "rm -rf .claude", False, "hook settings"),
    bash("esc-mv-claude-dir", "merger-m", "mv .claude /tmp/x", False, "hook settings"),
    bash("esc-rm-claude-glob", "merger-m", "rm -f .claude/*", False, "ov guard"),
    bash("esc-git-clean-hooks", "merger-m", "git clean -fdx", False, "hook settings"),
    bash("esc-git-stash-untracked", "merger-m", "git stash -u", False, "hook settings"),
    bash("esc-git-stash-all", "merger-m", "git stash push --all -m wip", False, "hook settings"),
    bash("git-clean-dry-run", "merger-m", "git clean -ndx", True),
    bash("git-stash-tracked-only", "merger-m", "git stash && git stash pop", True),
    # ---- read-only: anything not positively read-only is refused
    bash("esc-pytest-basetemp", "scout-1", "pytest --basetemp={root}/x", False, "--basetemp"),
    bash("esc-pytest-junitxml-module", "reviewer-r", "python3 -m pytest --junitxml=/tmp/r.xml",
         False, "--junitxml"),
    bash("esc-pytest-rootdir", "reviewer-r", "pytest --rootdir={root} --cache-clear", False,
         "--rootdir"),
    bash("esc-pytest-override-ini", "reviewer-r", "pytest -o cache_dir={root}/c", False, "-o"),
    bash("pytest-ordinary-options", "reviewer-r", "pytest -p no:cacheprovider -k parse -x -q "
         "--tb=short -rA tests", True),
    bash("esc-pytest-addopts-env", "reviewer-r", "PYTEST_ADDOPTS=--basetemp=/tmp/b pytest", False,
         "PYTEST_ADDOPTS"),
    bash("esc-sort-compress-program", "scout-1", "sort --compress-program=sh file", False,
         "--compress-program"),
    bash("esc-sort-tempdir", "scout-1", "sort -T {root} big.txt", False, "-T"),
    bash("sort-ordinary", "scout-1", "sort -u -k2,2 -t: file", True),
    bash("esc-tar-compress-program", "scout-1", "tar -I 'sh -c \"touch x\"' -tf a.tar", False,
         "tar -I"),
    bash("esc-tar-use-compress-program", "scout-1", "tar --use-compress-program=sh -tf a.tar",
         False, "tar --use-compress-program"),
    bash("esc-tar-to-command", "scout-1", "tar --to-command=sh -xf a.tar", False, "--to-command"),
    bash("esc-tar-index-file", "scout-1", "tar -tf a.tar --index-file={root}/x", False, "tar"),
    bash("tar-list", "scout-1", "tar -tzvf a.tgz", True),
    bash("esc-xargs-sh-c-stdin", "scout-1", "find . -name '*.py' | xargs sh -c", False,
         "xargs"),
    bash("esc-xargs-replace-into-script", "scout-1", "ls | xargs -I{} sh -c 'cat {}'", False,
         "xargs"),
    bash("esc-sed-w-no-space", "scout-1", "sed -n '1w/tmp/x' src/app.py", False, "w /tmp/x"),
    bash("esc-sed-w-path", "scout-1", "sed -n '1w {root}/x' src/app.py", False, "sed script"),
    bash("esc-sed-w-regex-flag", "scout-1", "sed -n '/x/I w out' src/app.py", False, "w out"),
    bash("esc-sed-s-w-flag", "scout-1", "sed 's/a/b/w out' src/app.py", False, "w out"),
    bash("esc-sed-e-command", "scout-1", "sed -n '1e touch x' src/app.py", False, "sed script"),
    bash("esc-sed-block-w", "scout-1", "sed -n -e '1{p;w out' -e '}' src/app.py", False, "w out"),
    bash("sed-ordinary", "scout-1", "sed -n -e 's/a/b/g' -e '/^#/d' -e '$p' src/app.py", True),
    bash("esc-brace-expansion-read-only", "scout-1", "echo {a,b}", False, "brace expansion"),
    bash("esc-brace-makes-command", "scout-1", "{sort,-o,{root}/x} README.md", False,
         "brace expansion"),
    bash("esc-ansi-c-option", "scout-1", "sort $'-o' {root}/x README.md", False, "ANSI-C"),
    bash("esc-tilde-user-read-only", "scout-1", "ls ~root", False, "~user"),
    bash("esc-cdpath-read-only", "scout-1", "CDPATH={root} cd src", False, "CDPATH"),
    bash("esc-ifs-assignment", "scout-1", "IFS=/; ls", False, "IFS"),
    bash("esc-ifs-expansion", "scout-1", "ls${IFS}-la", False, "IFS"),
    bash("esc-ifs-quoted-read-only", "scout-1", 'echo "${IFS}"', False, "IFS"),
    bash("read-with-ifs-prefix", "scout-1", "git ls-files | while IFS= read -r f; do wc -l \"$f\";"
         " done", True),
    bash("esc-setsid-read-only", "scout-1", "setsid ls", False, "setsid"),
    bash("esc-coproc-read-only", "scout-1", "coproc cat README.md", False, "coproc"),
    bash("esc-flock-read-only", "scout-1", "flock /tmp/l cat README.md", False, "flock"),
    bash("esc-nohup-unknown", "scout-1", "nohup frobnicate", False, "not on its list"),
    bash("nohup-known-read", "scout-1", "nohup cat README.md", True),
    bash("esc-computed-option", "scout-1", "git log $(echo --output={root}/x)", False,
         "computed at run time"),
    bash("esc-computed-find-action", "scout-1", "find . $(echo -delete)", False,
         "computed at run time"),
    bash("computed-arg-to-plain-reader", "scout-1", "grep -n TODO $(git ls-files)", True),
    bash("esc-less-log-file", "scout-1", "less -o {root}/x README.md", False, "less -o"),
    bash("esc-man-pager", "scout-1", "man -P 'touch x' ls", False, "man"),
    bash("esc-history-write", "scout-1", "history -w {root}/x", False, "history"),
    bash("esc-hash-p", "scout-1", "hash -p /bin/rm cat; cat x", False, "hash -p"),
    bash("esc-printf-v-path", "scout-1", "printf -v PATH /tmp/evil", False, "PATH"),
    bash("esc-read-into-path", "scout-1", "read PATH <<< /tmp/x", False, "PATH"),
    bash("esc-path-prefix", "scout-1", "PATH=/tmp/evil:$PATH git status", False, "PATH"),
    bash("pythonpath-inside-worktree", "reviewer-r", "PYTHONPATH=src:. python3 -m pytest -q", True),
    bash("esc-pythonpath-outside", "reviewer-r", "PYTHONPATH=/tmp/evil python3 -m pytest -q", False,
         "PYTHONPATH"),
    bash("esc-lessopen", "scout-1", "LESSOPEN='|touch x %s' less README.md", False, "LESSOPEN"),
    bash("esc-arithmetic-injection", "scout-1", "x='a[$(touch y)]'; [[ $x -eq 0 ]]", False,
         "arithmetic"),
    bash("esc-arithmetic-expansion", "scout-1", "echo $((x+1))", False, "arithmetic"),
    bash("esc-prompt-expansion", "builder-a", "x='$(touch {root}/x)'; echo ${x@P}", False,
         "@P"),
    bash("esc-awk-print-to-file", "scout-1", "awk '{print > \"out\"}' f", False, "awk"),
    bash("esc-awk-dump-variables", "scout-1", "awk -d/tmp/x 1 f", False, "awk -d"),
    bash("awk-regex-with-bar", "scout-1", "awk '/a|b/ {print $1}' f", True),
    bash("esc-mypy-report", "reviewer-r", "mypy --html-report {root}/r src", False,
         "--html-report"),
    bash("esc-go-test-exec", "reviewer-r", "go test -exec 'touch x' ./...", False, "exec"),
    bash("go-test-ordinary", "reviewer-r", "go test -run TestX -count=1 -v ./...", True),
    bash("esc-cargo-target-dir", "reviewer-r", "cargo test --target-dir {root}/t", False,
         "--target-dir"),
    bash("cargo-test-forwarded", "reviewer-r", "cargo test -- --nocapture", True),
    bash("esc-npm-test-forwarded", "reviewer-r", "npm test -- --outputFile={root}/x", False,
         "--outputFile"),
    bash("esc-make-variable", "reviewer-r", "make test PYTHON='touch x;python'", False,
         "make variables"),
    bash("esc-make-file", "reviewer-r", "make -f /tmp/evil.mk test", False, "make -f"),
    bash("esc-ruff-output-file", "reviewer-r", "ruff check -o {root}/r.txt src", False, "-o"),
    bash("esc-subshell-cd-read-only", "scout-1", "(cd /tmp); git status", False,
         "outside its worktree"),
    bash("subshell-cd-then-read", "scout-1", "(cd src); ls", True),
    bash("esc-unknown-cwd-read-only", "scout-1", "cd \"$(git rev-parse --show-toplevel)\"; pytest",
         False, "working directory is unknown"),
    # ---- writers: shell forms the parser must model, not skip
    bash("esc-brace-into-checkout", "builder-a", "touch {{root}/x,y}", False, "project checkout"),
    bash("brace-inside-worktree", "builder-a", "mkdir -p src/{a,b/{c,d}} && touch x{1..3}.txt",
         True),
    bash("esc-ansi-c-target", "builder-a", "echo x > $'{root}/x'", False, "project checkout"),
    bash("esc-ansi-c-escapes", "builder-a", "echo x > $'\\x2fetc/motd'", False, "/etc/motd"),
    bash("esc-tilde-user", "builder-a", "touch ~root/x", False, "/root/x"),
    bash("esc-cdpath-writer", "builder-a", "CDPATH={root} cd src && touch x", False,
         "which directory"),
    bash("esc-cdpath-exported", "builder-a", "export CDPATH={root}; cd src; touch x", False,
         "which directory"),
    bash("esc-ifs-program", "builder-a", "touch${IFS}{root}/x", False, "IFS"),
    bash("esc-ifs-argument", "builder-a", "touch a${IFS}{root}/x", False, "IFS"),
    bash("esc-setsid-writer", "builder-a", "setsid touch {root}/x", False, "project checkout"),
    bash("esc-flock-writer", "builder-a", "flock /tmp/l touch {root}/x", False,
         "project checkout"),
    bash("esc-coproc-writer", "builder-a", "coproc touch {root}/x", False, "project checkout"),
    bash("esc-nohup-background", "builder-a", "nohup touch {root}/x &", False, "project checkout"),
    bash("esc-time-output", "builder-a", "time -o {root}/x ls", False, "project checkout"),
    bash("esc-strace-output", "builder-a", "strace -o {root}/x ls", False, "project checkout"),
    bash("esc-tar-exec-writer", "builder-a", "tar -I 'sh -c \"touch {root}/x\"' -cf a.tar src",
         False, "project checkout"),
    bash("esc-variable-target", "builder-a", "x={root}/README.md; rm -f $x", False,
         "project checkout"),
    bash("esc-variable-cd", "builder-a", "d={root}; cd $d && touch x", False, "project checkout"),
    bash("esc-param-default", "builder-a", "rm -f ${NOPE:-{root}/README.md}", False,
         "project checkout"),
    bash("esc-computed-program", "builder-a", "$(echo rm) -rf {root}", False,
         "computed at run time"),
    bash("esc-eval-variable", "builder-a", "x='touch {root}/y'; eval \"$x\"", False,
         "project checkout"),
    bash("esc-alias-definition", "builder-a", "alias x='touch {root}/y'", False, "alias"),
    bash("esc-expand-aliases", "builder-a", "shopt -s expand_aliases; alias ls='rm -rf {root}'",
         False, "expand_aliases"),
    bash("esc-hash-p-writer", "builder-a", "hash -p /bin/rm ls; ls -rf {root}", False, "hash -p"),
    bash("esc-subst-in-parameter", "builder-a", "echo ${x:-$(touch {root}/x)}", False,
         "project checkout"),
    bash("esc-subst-in-arithmetic", "builder-a", "echo $(( $(touch {root}/x) ))", False,
         "project checkout"),
    bash("esc-subst-in-quoted-parameter", "scout-1", 'echo "${x:-$(touch y)}"', False, "touch"),
    bash("interpreter-write-by-design", "builder-a", "python3 -c \"open('{root}/x','w')\"", True),
    bash("esc-unknown-program-on-checkout", "builder-a", "python3 tools/fix.py {root}/README.md",
         False, "ov cannot tell whether this command writes"),
    bash("esc-systemd-run", "builder-a", "systemd-run touch x", False, "outside this turn"),
    bash("esc-at-job", "builder-a", "echo 'touch x' | at now", False, "outside this turn"),
    bash("esc-pkill", "builder-a", "pkill -f 'ov '", False, "other agents"),
    bash("esc-tmux-kill", "builder-a", "tmux kill-server", False, "tmux"),
    bash("chmod-long-mode-is-quick", "builder-a", "chmod " + "u+" * 40 + "! x", True),
    write("esc-write-tool-dollar", "builder-a", "{root}/$x", False, "project checkout"),
    # ---- the working directory after a cd that may not have happened
    bash("esc-cd-in-subshell", "builder-a", "(cd /tmp); touch ../../x", False, "outside it"),
    bash("esc-cd-after-false", "builder-a", "false && cd /tmp; touch ../../x", False,
         "outside it"),
    bash("esc-failing-cd", "builder-a", "cd /nonexistent-dir; touch ../../x", False, "outside it"),
    bash("esc-cd-or", "builder-a", "true || cd /tmp; touch ../../x", False, "outside it"),
    bash("esc-cd-pipeline", "builder-a", "cd /tmp | true; touch ../../x", False, "outside it"),
    bash("esc-cd-negated", "builder-a", "! cd src/deep && touch ../../x", False, "ov's own state"),
    bash("esc-cd-computed", "builder-a", "cd \"$(mktemp -d)\" && touch x", False,
         "which directory"),
    bash("esc-cd-dash", "builder-a", "cd /tmp; cd -; touch x", False, "which directory"),
    bash("esc-cd-in-loop", "builder-a", "for d in a b; do touch x; cd ..; done", False,
         "which directory"),
    bash("esc-cd-in-function", "builder-a", "f() { cd ..; }; f; f; touch x", False,
         "which directory"),
    bash("esc-cd-in-eval", "builder-a", "eval \"cd {root}\"; touch x", False, "which directory"),
    bash("esc-popd", "builder-a", "pushd src; popd; touch x", False, "which directory"),
    bash("esc-builtin-cd", "builder-a", "builtin cd /tmp; touch ../x", False, "outside it"),
    bash("esc-cd-symlink-dotdot", "builder-a", "cd peek && cd ../.. && touch x", False,
         "which directory"),
    bash("cd-then-semicolon-inside", "builder-a", "cd src; touch x", True),
    bash("cd-and-chain-inside", "builder-a", "cd /tmp && touch x && cd - >/dev/null", True),
    bash("cd-subshell-own-dirs", "builder-a", "(cd src && touch a); touch b", True),
    # ---- impersonation and ov's own variables
    bash("esc-agent-name-prefix", "builder-a",
         "OVERSTORY_AGENT_NAME=operator ov mail send --to x --subject s --body b", False,
         "OVERSTORY_AGENT_NAME"),
    bash("esc-env-u-turn-id", "builder-a", "env -u OVERSTORY_TURN_ID setsid sleep 100", False,
         "env -u"),
    bash("esc-env-i", "builder-a", "env -i ov stop builder-b --clean", False, "env -i"),
    bash("esc-unset-agent-name", "builder-a", "unset OVERSTORY_AGENT_NAME; ov mail check", False,
         "OVERSTORY_AGENT_NAME"),
    bash("esc-exec-c", "builder-a", "exec -c ov mail check", False, "exec -c"),
    # ---- ov subcommands by capability
    bash("esc-ov-stop-clean-scout", "scout-1", "ov stop builder-b --clean", False,
         "coordinator and leads"),
    bash("esc-ov-stop-clean-lead", "lead-l", "ov stop builder-b --clean", False,
         "only the operator"),
    bash("ov-stop-by-lead", "lead-l", "ov stop builder-b", True),
    bash("esc-ov-stop-by-builder", "builder-a", "ov stop builder-b", False,
         "coordinator and leads"),
    bash("esc-ov-mail-from-operator", "scout-1",
         "ov mail send --from operator --to lead-l --subject s --body b", False, "--from operator"),
    bash("esc-ov-mail-reply-from", "builder-a", "ov mail reply 3 --from coordinator --body x",
         False, "--from coordinator"),
    bash("esc-ov-mail-from-equals", "reviewer-r",
         "ov mail send --from=lead-l --to coordinator --subject s --body b", False, "--from lead-l"),
    bash("ov-project-is-own", "scout-1", "ov --project {root} status", True),
    bash("ov-mail-from-self", "scout-1",
         "ov mail send --from scout-1 --to lead-l --subject s --body b", True),
    bash("esc-ov-merge-builder", "builder-a", "ov merge builder-b", False, "mergers"),
    bash("ov-merge-merger", "merger-m", "ov merge builder-a", True),
    bash("ov-merge-coordinator", "coordinator", "ov merge builder-a", True, cwd="{root}"),
    bash("esc-ov-mail-check-other", "scout-1", "ov mail check --agent builder-b", False, "--peek"),
    bash("ov-mail-peek-other", "scout-1", "ov mail check --agent builder-b --peek", True),
    bash("esc-ov-mail-purge", "lead-l", "ov mail purge --older-than 1d", False, "ov mail purge"),
    bash("esc-ov-coordinator-stop", "scout-1", "ov coordinator stop", False, "operator"),
    bash("esc-ov-coordinator-send", "coordinator", "ov coordinator send 'more work'", False, "operator",
         cwd="{root}"),
    # The coordinator's read-only verbs: is the run's objective done, what did the run produce.
    bash("ov-coordinator-check-complete", "coordinator", "ov coordinator check-complete --json", True,
         cwd="{root}"),
    bash("ov-coordinator-reads", "lead-l", "ov coordinator status && ov coordinator output --json", True),
    bash("esc-ov-init", "builder-a", "ov init", False, "operator"),
    # This round's operator verbs: an agent neither kills the operator's dashboards, starts daemons nor
    # regroups the team.
    bash("esc-ov-watch-kill-others", "lead-l", "ov watch --kill-others --once", False, "operator"),
    bash("esc-ov-watchdog-background", "builder-a", "ov watchdog --background", False, "operator"),
    bash("esc-ov-coordinator-start-watchdog", "coordinator", "ov coordinator start --watchdog", False, "operator",
         cwd="{root}"),
    bash("esc-ov-group-add", "lead-l", "ov group add sweep builder-b", False, "not a command agents may run"),
    bash("esc-ov-via-python", "scout-1", "python3 -m overstory stop builder-b --clean", False,
         "coordinator and leads"),
    bash("esc-ov-other-project", "scout-1", "ov --project /tmp/other status", False,
         "another project"),
    bash("esc-ov-computed-target", "lead-l", "ov stop $(echo builder-b)", False,
         "computed at run time"),
    bash("ov-reads", "scout-1", "ov status --json && ov logs builder-b && ov tree && ov diff builder-b --stat",
         True),
    bash("esc-ov-clean", "lead-l", "ov clean --completed --force", False, "operator"),
    bash("esc-ov-serve", "builder-a", "ov serve --port 0", False, "operator"),
    bash("ov-reply-to-looked-up-id", "coordinator",
         "ov mail reply $(ov mail list --to coordinator | tail -n 1 | cut -d ' ' -f 1) --body ok",
         True, cwd="{root}"),
    # ---- size and text the guard reserves
    bash("esc-over-64-kb", "builder-a", "echo " + "x" * (64 * 1024), False, "64 KB"),
    bash("esc-reserved-marker", "builder-a", "touch {root}/__ov_cmdsub__", False, "reserves"),
]


CASES: list[Case] = [
    # ---- outside an agent everything is allowed
    write("operator-writes-anywhere", "operator", "/etc/passwd", True),
    Case("operator-may-use-task", "operator", "Task", {"prompt": "x"}, True),
    bash("operator-may-push", "operator", "git push --force origin main", True),
    # ---- Claude's own delegation tools are blocked for everyone
    Case("builder-task-tool", "builder-a", "Task", {"prompt": "do it"}, False, "ov sling"),
    Case("scout-agent-tool", "scout-1", "Agent", {"prompt": "x"}, False, "ov mail send"),
    Case("coordinator-team-create", "coordinator", "TeamCreate", {}, False, "ov sling"),
    Case("lead-send-message", "lead-l", "SendMessage", {"to": "x"}, False, "ov mail send"),
    Case("builder-enter-worktree", "builder-a", "EnterWorktree", {"name": "x"}, False,
         "ov manages your worktree"),
    Case("merger-workflow", "merger-m", "Workflow", {"script": "x"}, False, "ov sling"),
    # ---- reading is never restricted
    Case("scout-reads-other-worktree", "scout-1", "Read", {"file_path": "{other}/README.md"},
         True),
    Case("reviewer-grep", "reviewer-r", "Grep", {"pattern": "x"}, True),
    Case("builder-mcp-tool", "builder-a", "mcp__docs__search", {"q": "x"}, True),
    Case("builder-todo", "builder-a", "TodoWrite", {"todos": []}, True),
    # ---- file tools: read-only capabilities
    write("scout-write", "scout-1", "{wt}/notes.md", False, "scout-1 (scout) is read-only"),
    write("reviewer-edit", "reviewer-r", "{wt}/src/app.py", False, "ov mail send", tool="Edit"),
    write("coordinator-notebook", "coordinator", "{root}/n.ipynb", False, "read-only",
          tool="NotebookEdit"),
    write("lead-multiedit", "lead-l", "{wt}/README.md", False, "read-only", tool="MultiEdit"),
    write("monitor-write-tmp", "monitor-w", "/tmp/x.txt", False, "read-only"),
    write("unknown-capability-is-read-only", "wizard-z", "{wt}/x.py", False,
          "treated as read-only"),
    # ---- file tools: writers
    write("builder-write-inside", "builder-a", "{wt}/src/new.py", True),
    write("builder-write-relative", "builder-a", "src/new.py", True),
    write("builder-write-relative-from-subdir", "builder-a", "../README.md", True,
          cwd="{wt}/src"),
    write("builder-write-dotdot-into-other", "builder-a", "{wt}/../builder-b/x.py", False,
          "builder-b's worktree"),
    write("builder-write-dotdot-into-checkout", "builder-a", "../../../src/app.py", False,
          "project checkout"),
    write("builder-write-symlink-escape", "builder-a", "{wt}/escape/motd", False,
          "/etc/motd"),
    write("builder-edit-symlink-into-other", "builder-a", "{wt}/peek/README.md", False,
          "builder-b's worktree", tool="Edit"),
    write("builder-write-name-prefix-sibling", "builder-a", "{wt}-evil/x.py", False,
          "builder-a-evil's worktree"),
    write("builder-write-other-worktree", "builder-a", "{other}/src/app.py", False,
          "ov mail send --to builder-b"),
    write("builder-write-state-db", "builder-a", "{root}/.overstory/state.db", False,
          "ov's own state"),
    write("builder-write-tmp", "builder-a", "/tmp/scratch/notes.txt", True),
    write("builder-write-etc", "builder-a", "/etc/hosts", False, "may only write inside"),
    write("builder-write-home", "builder-a", "{home}/.bashrc", False, "outside it"),
    write("builder-write-hook-settings", "builder-a", "{wt}/.claude/settings.local.json",
          False, "ov guard"),
    write("builder-write-git-metadata", "builder-a", "{wt}/.git", False, "git metadata"),
    write("merger-write-inside", "merger-m", "{wt}/merged.txt", True, tool="Edit"),
    write("writer-without-worktree", "builder-lost", "{root}/src/x.py", False,
          "OVERSTORY_WORKTREE is missing"),
    # ---- shell: read-only capabilities
    bash("scout-ls", "scout-1", "ls -la src", True),
    bash("scout-pipeline", "scout-1", "cat src/app.py | grep -n print | head -5 | wc -l", True),
    bash("scout-redirect", "scout-1", "echo findings > notes.md", False, "`> notes.md`"),
    bash("scout-append", "scout-1", "echo more >> notes.md", False, "redirect output"),
    bash("scout-devnull", "scout-1", "ls missing 2>/dev/null; ls >/dev/null 2>&1", True),
    bash("scout-both-to-devnull", "scout-1", "grep -r x . &>/dev/null || echo none", True),
    bash("scout-tee", "scout-1", "ls | tee listing.txt", False, "tee"),
    bash("scout-rm", "scout-1", "rm -rf build", False, "delete files"),
    bash("scout-mv", "scout-1", "mv a b", False, "move files"),
    bash("scout-touch-after-and", "scout-1", "ls && touch x", False, "touch"),
    bash("scout-newline-separated", "scout-1", "ls\nmkdir out", False, "create directories"),
    bash("scout-sed-in-place", "scout-1", "sed -i 's/a/b/' src/app.py", False, "sed -i"),
    bash("scout-sed-print", "scout-1", "sed -n '1,5p' src/app.py", True),
    bash("scout-sed-w-command", "scout-1", "sed -n '/x/w out.txt' src/app.py", False, "sed"),
    bash("scout-git-reads", "scout-1",
         "git status && git log --oneline -5 && git diff HEAD~1 -- src && git show HEAD:README.md",
         True),
    bash("scout-git-branch-list", "scout-1", "git branch -a && git branch --show-current", True),
    bash("scout-git-branch-create", "scout-1", "git branch feature", False, "git branch"),
    bash("scout-git-commit", "scout-1", "git commit -am wip", False, "git commit"),
    bash("scout-git-checkout", "scout-1", "git checkout main", False, "read-only"),
    bash("scout-git-stash-list", "scout-1", "git stash list", True),
    bash("scout-git-pager-config", "scout-1", "git -c core.pager='rm -rf .' log", False,
         "core.pager"),
    bash("scout-cmdsub-rm", "scout-1", "echo $(rm -rf build)", False, "delete files"),
    bash("scout-backtick-touch", "scout-1", "echo `touch x`", False, "touch"),
    bash("scout-cmdsub-in-double-quotes", "scout-1", 'echo "now: $(touch x)"', False, "touch"),
    bash("scout-single-quotes-are-literal", "scout-1", "echo '$(touch x) > y'", True),
    bash("scout-quoted-operator-is-data", "scout-1", 'grep -n ">" src/app.py', True),
    bash("scout-double-bracket-compare", "scout-1", "[[ 2 > 1 ]] && echo yes", True),
    bash("scout-comment", "scout-1", "ls # > not-a-redirect", True),
    bash("scout-heredoc-to-file", "scout-1", "cat > notes.md <<'EOF'\nhello\nEOF", False,
         "notes.md"),
    bash("scout-heredoc-body-is-data", "scout-1",
         "cat <<'EOF'\nrm -rf / > x; $(touch y)\nEOF\necho ok", True),
    bash("scout-unquoted-heredoc-runs-subst", "scout-1", "cat <<EOF\n$(touch y)\nEOF", False,
         "touch"),
    bash("scout-mail-with-heredoc", "scout-1",
         'ov mail send --to lead-l --subject "found it" --body "$(cat <<\'EOF\'\n'
         "the bug is in parse() (line 3)\nEOF\n)\"", True),
    bash("scout-process-substitution", "scout-1", "diff <(ls a) <(ls b)", True),
    bash("scout-process-substitution-writes", "scout-1", "ls > >(tee out.txt)", False, "tee"),
    bash("scout-python-c", "scout-1", "python3 -c 'open(\"x\",\"w\")'", False, "python -c"),
    bash("scout-python-stdin", "scout-1", "python3 - <<'EOF'\nprint(1)\nEOF", False,
         "cannot be checked"),
    bash("scout-node-e", "scout-1", "node -e 'require(\"fs\")'", False, "cannot be checked"),
    bash("scout-pytest", "reviewer-r", "pytest -q tests 2>&1 | tail -20", True),
    bash("scout-python-m-pytest", "reviewer-r", "python3 -m pytest -x -q", True),
    bash("scout-pytest-junit", "reviewer-r", "pytest --junitxml=report.xml", False, "report"),
    bash("scout-pip-install", "scout-1", "pip install requests", False, "read-only"),
    bash("scout-pip-list", "scout-1", "pip list | grep click", True),
    bash("scout-find", "scout-1", "find . -name '*.py' -newer README.md", True),
    bash("scout-find-delete", "scout-1", "find . -name '*.pyc' -delete", False, "find -delete"),
    bash("scout-find-exec-rm", "scout-1", "find . -name '*.pyc' -exec rm {} \\;", False,
         "delete files"),
    bash("scout-find-exec-grep", "scout-1", "find . -name '*.py' -exec grep -l TODO {} +", True),
    bash("scout-xargs-rm", "scout-1", "ls | xargs rm -f", False, "delete files"),
    bash("scout-xargs-grep", "scout-1", "git ls-files | xargs grep -n TODO", True),
    bash("scout-awk-print", "scout-1", "awk -F: '$3 > 100 {print $1}' /etc/passwd", True),
    bash("scout-awk-system", "scout-1", "awk '{system(\"rm \" $1)}' list", False, "awk"),
    bash("scout-bash-c-nested-write", "scout-1", "bash -c 'echo hi > f'", False, "`> f`"),
    bash("scout-bash-c-nested-read", "scout-1", "bash -lc 'ls | wc -l'", True),
    bash("scout-eval", "scout-1", 'eval "rm -rf build"', False, "delete files"),
    bash("scout-wrappers", "scout-1", "env FOO=1 timeout 5 nice -n 10 rm x", False,
         "delete files"),
    bash("scout-wrapped-read", "scout-1", "timeout 5 cat README.md", True),
    bash("scout-computed-command", "scout-1", "$(echo rm) -rf build", False,
         "computed at run time"),
    bash("scout-unparseable", "scout-1", 'echo "unterminated', False, "could not parse"),
    bash("scout-unknown-program", "scout-1", "frobnicate --all", False,
         "not on its list of read-only commands"),
    bash("scout-sudo", "scout-1", "sudo ls", False, "unprivileged"),
    bash("scout-case-statement", "scout-1", 'case "$1" in a|b) echo ab;; *) ls;; esac', True),
    bash("scout-case-hides-rm", "scout-1", "case x in x) rm -f y;; esac", False, "delete files"),
    bash("scout-git-fetch", "scout-1", "git fetch origin", False, "git fetch"),
    bash("scout-loop", "scout-1", 'for f in src/*.py; do wc -l "$f"; done', True),
    bash("scout-curl-stdout", "scout-1", "curl -s http://127.0.0.1:1/x | jq .", True),
    bash("scout-curl-output-file", "scout-1", "curl -o page.html http://127.0.0.1:1/", False,
         "curl"),
    bash("scout-ov-commands", "scout-1",
         "ov mail check && ov mail send --to lead-l --subject s --body b", True),
    bash("coordinator-sling", "coordinator", "ov sling builder task-7 --parent coordinator", True,
         cwd="{root}"),
    bash("coordinator-git-log", "coordinator", "git log --oneline --all -20", True,
         cwd="{root}"),
    Case("reviewer-monitor-tool-write", "reviewer-r", "Monitor",
         {"command": "rm -rf build", "description": "x", "timeout_ms": 1, "persistent": False},
         False, "delete files"),
    Case("reviewer-repl", "reviewer-r", "REPL", {"code": "1"}, False, "REPL"),
    # ---- git rules for everyone
    bash("builder-git-push", "builder-a", "git push origin ov/builder-a", False,
         "nobody pushes"),
    bash("builder-git-push-force-hidden", "builder-a", "git add -A && git push --force", False,
         "nobody pushes"),
    bash("builder-git-push-in-subst", "builder-a", "echo $(git -C {wt} push)", False,
         "nobody pushes"),
    bash("lead-git-push", "lead-l", "git push", False, "nobody pushes"),
    bash("builder-git-reset-hard", "builder-a", "git reset --hard HEAD~1", False, "git restore"),
    bash("builder-git-reset-soft", "builder-a", "git reset --soft HEAD~1", True),
    bash("builder-git-branch-delete-other", "builder-a", "git branch -D main", False,
         "does not own"),
    bash("builder-git-branch-force-other", "builder-a", "git branch -f ov/builder-b HEAD", False,
         "does not own"),
    bash("builder-git-branch-rename", "builder-a", "git branch -m shiny", False, "renaming"),
    bash("builder-git-checkout-B", "builder-a", "git checkout -B main", False, "force-resets"),
    bash("builder-git-switch-C", "builder-a", "git switch -C main", False, "force-resets"),
    bash("builder-git-update-ref", "builder-a", "git update-ref refs/heads/main HEAD", False,
         "rewrites refs"),
    bash("builder-git-worktree-add", "builder-a", "git worktree add ../x", False,
         "ov manages git worktrees"),
    bash("builder-git-config-write", "builder-a", "git config user.name bot", False,
         "shared"),
    bash("builder-git-config-read", "builder-a", "git config user.name", True),
    bash("builder-git-fetch-into-branch", "builder-a", "git fetch origin main:main", False,
         "overwrite the local branch main"),
    bash("builder-git-stash-clear", "builder-a", "git stash clear", False, "shared"),
    bash("builder-gh-pr-create", "builder-a", "gh pr create --fill", False, "remote"),
    # ---- git for writers
    bash("builder-git-commit", "builder-a", "git add -A && git commit -m 'add parser'", True),
    bash("builder-git-commit-heredoc", "builder-a", COMMIT_HEREDOC, True),
    bash("builder-git-clean-in-worktree", "builder-a", "git clean -fdx", True),
    bash("builder-git-clean-project-root", "builder-a", "git -C {root} clean -fdx", False,
         "project checkout"),
    bash("builder-git-clean-after-cd", "builder-a", "cd .. && git clean -fdx", False,
         "ov's own state"),
    bash("builder-git-commit-other-worktree", "builder-a", "git -C ../builder-b commit -am x",
         False, "builder-b's worktree"),
    bash("builder-git-checkout-other-branch", "builder-a", "git checkout main", False,
         "git restore"),
    bash("builder-git-checkout-new-branch", "builder-a", "git checkout -b side", False,
         "ov/builder-a"),
    bash("builder-git-checkout-file", "builder-a", "git checkout -- README.md", True),
    bash("builder-git-checkout-existing-path", "builder-a", "git checkout src/app.py", True),
    bash("builder-git-switch-own", "builder-a", "git switch ov/builder-a", True),
    bash("merger-git-merge", "merger-m", "git merge --no-ff ov/builder-a", True),
    # ---- shell: writers and paths
    bash("builder-redirect-inside", "builder-a", "echo x > out.txt && echo y >> build/log",
         True),
    bash("builder-redirect-etc", "builder-a", "echo x > /etc/motd", False, "/etc/motd"),
    bash("builder-redirect-other", "builder-a", "echo x >> ../builder-b/notes", False,
         "builder-b's worktree"),
    bash("builder-redirect-symlink-escape", "builder-a", "echo x > escape/motd", False,
         "/etc/motd"),
    bash("builder-rm-inside", "builder-a", "rm -rf build/ out.txt", True),
    bash("builder-rm-root", "builder-a", "rm -rf /", False, "may only write inside"),
    bash("builder-rm-own-worktree", "builder-a", "rm -rf .", False, "its own worktree"),
    bash("builder-cp-into-other", "builder-a", "cp src/app.py ../builder-b/src/", False,
         "builder-b's worktree"),
    bash("builder-cp-from-other", "builder-a", "cp ../builder-b/README.md notes.md", True),
    bash("builder-mv-out-of-checkout", "builder-a", "mv {root}/README.md .", False,
         "project checkout"),
    bash("builder-cd-escape", "builder-a", "cd /etc && touch x", False, "/etc/x"),
    bash("builder-cd-home", "builder-a", "cd; touch x", False, "outside"),
    bash("builder-env-chdir", "builder-a", "env -C /etc touch x", False, "/etc/x"),
    bash("builder-nested-shell-cd", "builder-a", "bash -c 'cd /etc && touch y'", False, "/etc/y"),
    bash("builder-push-in-watch", "builder-a", "watch -n 5 'git push'", False, "nobody pushes"),
    bash("builder-cd-inside", "builder-a", "cd src && touch x && cd .. && mkdir -p y/z", True),
    bash("builder-tee-tmp", "builder-a", "ls | tee /tmp/listing.txt", True),
    bash("builder-tee-state", "builder-a", "ls | tee {root}/.overstory/notes", False,
         "ov's own state"),
    bash("builder-sed-in-place-checkout", "builder-a", "sed -i 's/a/b/' {root}/README.md", False,
         "project checkout"),
    bash("builder-sed-in-place-inside", "builder-a", "sed -i.bak -e 's/a/b/' src/app.py", True),
    bash("builder-hook-settings-shell", "builder-a", "echo '{}' > .claude/settings.local.json",
         False, "ov guard"),
    bash("builder-expands-home", "builder-a", "echo x >> $HOME/.profile", False, ".profile"),
    bash("builder-expands-tilde", "builder-a", "touch ~/x", False, "outside"),
    bash("builder-expands-worktree-var", "builder-a", 'echo x > "$OVERSTORY_WORKTREE/out"', True),
    bash("builder-cmdsub-outside", "builder-a", "echo $(rm -rf {root}/src)", False,
         "project checkout"),
    bash("builder-unknowable-target", "builder-a", 'rm -rf "$(mktemp -d)"', True),
    bash("builder-find-delete-inside", "builder-a", "find . -name '*.pyc' -delete", True),
    bash("builder-find-delete-outside", "builder-a", "find / -name '*.pyc' -delete", False,
         "may only write inside"),
    bash("builder-find-exec-rm-inside", "builder-a", "find build -name '*.o' -exec rm {} +",
         True),
    bash("builder-dd-device", "builder-a", "dd if=/dev/zero of=/dev/sda bs=1M", False,
         "/dev/sda"),
    bash("builder-pip-install-shared", "builder-a", "pip install -e .", False,
         "install packages"),
    bash("builder-pip-install-venv", "builder-a", ".venv/bin/pip install -e .", True),
    bash("builder-npm-install-local", "builder-a", "npm install left-pad", True),
    bash("builder-npm-install-global", "builder-a", "npm i -g left-pad", False, "globally"),
    bash("builder-apt-get", "builder-a", "apt-get install -y jq", False, "system"),
    bash("builder-python-c", "builder-a", "python3 -c 'print(1)' && python3 tools/gen.py", True),
    bash("builder-sqlite-on-state", "builder-a", "sqlite3 {root}/.overstory/state.db 'delete from mail'",
         False, "ov's own state"),
    bash("builder-tool-on-other-worktree", "builder-a", "black ../builder-b/src", False,
         "builder-b's worktree"),
    bash("builder-sudo", "builder-a", "sudo rm -rf /tmp/x", False, "unprivileged"),
    bash("builder-unparseable", "builder-a", "echo $(ls", False, "could not parse"),
    bash("builder-make-in-project-root", "builder-a", "cd {root} && make", False,
         "project checkout"),
    Case("builder-repl", "builder-a", "REPL", {"code": "1"}, True),
    Case("builder-monitor-tail", "builder-a", "Monitor",
         {"command": "tail -f build/log", "description": "x", "timeout_ms": 1,
          "persistent": False}, True),
    *ESCAPES,
    *REFUSALS,
]


def test_table_is_large_and_ids_unique() -> None:
    ids = [case.test_id for case in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 60 and len(ESCAPES) >= 150
    assert {case.allowed for case in CASES} == {True, False}


@pytest.mark.parametrize("case", CASES, ids=[case.test_id for case in CASES])
def test_guard_table(case: Case, project: Project) -> None:
    payload = hook_input(project, case.agent, case.tool, case.tool_input, case.cwd)
    decision = guards.decide(payload, {**project.env(case.agent), **(case.extra_env or {})})
    assert decision.allow is case.allowed, decision.reason
    if case.allowed:
        assert decision.reason == ""
    else:
        assert case.reason_has in project.fill(decision.reason, case.agent)
        assert project.fill(case.reason_has, case.agent) in decision.reason


# --------------------------------------------------------------------------- hook input shape


def test_other_hook_events_are_not_judged(project: Project) -> None:
    payload = hook_input(project, "scout-1", "Write", {"file_path": "/etc/x"})
    payload["hook_event_name"] = "PostToolUse"
    assert guards.decide(payload, project.env("scout-1")).allow


@pytest.mark.parametrize("broken", [{"tool_name": ""}, {"tool_name": None},
                                    {"tool_input": "rm -rf /"}, {"tool_input": ["x"]}])
def test_malformed_hook_input_is_denied_inside_an_agent(project: Project, broken: dict) -> None:
    payload = hook_input(project, "builder-a", "Bash", {"command": "ls"})
    payload.update(broken)
    decision = guards.decide(payload, project.env("builder-a"))
    assert not decision.allow
    assert "tool_" in decision.reason


def test_write_without_a_path_is_denied(project: Project) -> None:
    payload = hook_input(project, "builder-a", "Write", {"content": "x"})
    assert not guards.decide(payload, project.env("builder-a")).allow


def test_relative_paths_use_the_worktree_when_cwd_is_missing(project: Project) -> None:
    payload = hook_input(project, "builder-a", "Write", {"file_path": "src/x.py"})
    del payload["cwd"]
    assert guards.decide(payload, project.env("builder-a")).allow
    payload["tool_input"] = {"file_path": "../builder-b/x.py"}
    assert "builder-b" in guards.decide(payload, project.env("builder-a")).reason


def test_own_branch_comes_from_the_environment(project: Project) -> None:
    env = project.env("builder-a") | {"OVERSTORY_BRANCH": "ov/builder-a-g2"}
    payload = hook_input(project, "builder-a", "Bash", {"command": "git switch ov/builder-a-g2"})
    assert guards.decide(payload, env).allow
    payload["tool_input"] = {"command": "git branch -D ov/builder-a-g2 old"}
    reason = guards.decide(payload, env).reason
    assert "old" in reason and "ov/builder-a-g2," not in reason


def test_worktree_equal_to_project_root_still_protects_ov_state(project: Project) -> None:
    """turns.py gives an agent without a worktree OVERSTORY_WORKTREE=<project root>."""
    env = project.env("builder-a") | {"OVERSTORY_WORKTREE": str(project.root)}
    for path in ("{root}/.overstory/state.db", "{other}/x.py"):
        payload = hook_input(project, "builder-a", "Write", {"file_path": path}, cwd="{root}")
        assert not guards.decide(payload, env).allow, path
    payload = hook_input(project, "builder-a", "Write", {"file_path": "{root}/src/x.py"},
                         cwd="{root}")
    assert guards.decide(payload, env).allow


def test_blocked_tools_are_an_extensible_mapping() -> None:
    assert {"Task", "Agent", "TeamCreate", "TeamDelete", "SendMessage"} <= set(guards.BLOCKED_TOOLS)
    assert all(reason for reason in guards.BLOCKED_TOOLS.values())


def test_internal_errors_fail_closed(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("overstory.guards.policy.check_shell", explode)
    payload = hook_input(project, "builder-a", "Bash", {"command": "ls"})
    decision = guards.decide(payload, project.env("builder-a"))
    assert not decision.allow
    assert "boom" in decision.reason


# --------------------------------------------------------------------------- shell splitting


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("a && b || c; d | e & f", [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]),
        ("echo 'a;b' \"c|d\"", [["echo", "a;b", "c|d"]]),
        ("x=$(inner one) outer", [["inner", "one"], ["x=__ov_cmdsub__", "outer"]]),
        ("(cd a && b) && c", [["cd", "a"], ["b"], ["c"]]),
        ("echo a\\\nb", [["echo", "ab"]]),
        ("echo $((1 + 2)) ${HOME:-x}", [["echo", "0", "${HOME:-x}"]]),
        ("case $v in a) x;; b|c) y;; esac", [["x"], ["y"], ["esac"]]),
    ],
)
def test_split_shell_words(script: str, expected: list[list[str]]) -> None:
    assert [c.argv for c in guards.split_shell(script)] == expected


def test_split_shell_redirections() -> None:
    [command] = guards.split_shell("cmd 2>/dev/null >out 2>&1 <in &>>log a2>b")
    assert command.argv == ["cmd", "a2"]
    assert command.redirects == [(">", "/dev/null"), (">", "out"), (">&", "1"), ("<", "in"),
                                 ("&>>", "log"), (">", "b")]


def test_split_shell_heredoc_inside_substitution() -> None:
    commands = guards.split_shell(COMMIT_HEREDOC)
    assert [c.argv[0] for c in commands] == ["cat", "git"]
    assert commands[1].argv[-1] == "__ov_cmdsub__"


@pytest.mark.parametrize("script", ["echo 'a", 'echo "a', "echo $(a", "echo `a", "(a", "cat <<",
                                    "echo > "])
def test_split_shell_rejects_broken_input(script: str) -> None:
    with pytest.raises(ValueError):
        guards.split_shell(script)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab $()`'\"\\;&|<>\n#{}=-~/.*")), max_size=40))
def test_shell_checks_never_crash(project: Project, script: str) -> None:
    """Whatever the text, the checker returns a verdict instead of raising."""
    for agent in ("scout-1", "builder-a"):
        env = project.env(agent)
        agent_obj = guards._Agent.from_env(agent, env)
        verdict = guards.check_shell(script, agent_obj, str(project.start_dir(agent)))
        assert verdict is None or isinstance(verdict, str)


# --------------------------------------------------------------------------- the CLI

DENY_PREFIX = '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny",'


def agent_env_for_runner(project: Project, agent: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in ("OVERSTORY_AGENT_NAME", "OVERSTORY_CAPABILITY",
                                                    "OVERSTORY_WORKTREE", "OVERSTORY_PROJECT_ROOT",
                                                    "OVERSTORY_BRANCH")}
    env.update(project.env(agent))
    return env


def test_cli_denies_with_claudes_exact_format(project: Project) -> None:
    payload = hook_input(project, "scout-1", "Write", {"file_path": "{wt}/x.md", "content": "x"})
    result = CliRunner().invoke(guard, [], input=json.dumps(payload),
                                env=agent_env_for_runner(project, "scout-1"))
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith(DENY_PREFIX)
    parsed = json.loads(line)
    reason = parsed["hookSpecificOutput"]["permissionDecisionReason"]
    assert line == DENY_PREFIX + '"permissionDecisionReason":' + json.dumps(reason) + "}}"
    assert "scout-1 (scout) is read-only" in reason


def test_cli_allows_silently(project: Project) -> None:
    payload = hook_input(project, "builder-a", "Bash", {"command": "git status"})
    result = CliRunner().invoke(guard, [], input=json.dumps(payload),
                                env=agent_env_for_runner(project, "builder-a"))
    assert result.exit_code == 0
    assert result.output == ""


@pytest.mark.parametrize("stdin", ["", "{not json", "[1, 2]", "\xff\xfe"])
def test_cli_fails_closed_inside_an_agent(project: Project, stdin: str) -> None:
    """Input whose runtime cannot even be told is refused the one way every runtime understands:
    exit 2 with the reason on stderr (Claude, Codex and Gemini CLI block on it; ov's OpenCode plugin
    blocks on any non-zero exit)."""
    result = CliRunner().invoke(guard, [], input=stdin,
                                env=agent_env_for_runner(project, "builder-a"))
    assert result.exit_code == 2
    assert "call blocked" in result.stderr and result.stdout == ""


def test_cli_allows_anything_outside_an_agent(project: Project) -> None:
    result = CliRunner().invoke(guard, [], input="{not json",
                                env=agent_env_for_runner(project, "operator"))
    assert result.exit_code == 0
    assert result.output == ""


def _run_guard_process(project: Project, agent: str, payload: dict[str, Any]
                       ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
    env.update(project.env(agent))
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-c", "from overstory.cli.guard import guard; guard()"],
        input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=60,
    )


def test_guard_in_a_real_process(project: Project) -> None:
    denied = _run_guard_process(
        project, "builder-a", hook_input(project, "builder-a", "Bash", {"command": "git push"}))
    assert denied.returncode == 0, denied.stderr
    body = json.loads(denied.stdout)["hookSpecificOutput"]
    assert body["hookEventName"] == "PreToolUse"
    assert body["permissionDecision"] == "deny"
    assert "nobody pushes" in body["permissionDecisionReason"]

    allowed = _run_guard_process(
        project, "builder-a", hook_input(project, "builder-a", "Write",
                                         {"file_path": "{wt}/ok.txt", "content": "x"}))
    assert (allowed.returncode, allowed.stdout) == (0, "")


HEAVY_MODULES = ["pydantic", "rich", "git", "libtmux", "anthropic", "yaml"]


def test_guard_imports_stay_light() -> None:
    code = (
        "import json, sys, overstory.cli.guard\n"
        f"print(json.dumps(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == []

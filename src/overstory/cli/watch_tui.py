"""The interactive `ov watch`: the dashboard on the terminal's alternate screen, driven by keys.

Built on rich (already a dependency) plus the terminal's own cbreak mode rather
than a TUI framework: the screen is the same renderer `ov watch --once` prints,
NO_COLOR can strip every style (bold and dim too), and handing the terminal to
`ov attach` and taking it back is two lines. Keys act through ``watch_actions``,
which runs `ov` commands by name.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import termios
import time
import tty
import typing as t
from dataclasses import dataclass, field

from overstory.cli import watch_actions as actions

if t.TYPE_CHECKING:
    import sqlite3

    from overstory.paths import ProjectPaths

STREAM_POLL = 0.5
KEY_SEQUENCES = {
    "\x1b[A": "up", "\x1bOA": "up", "\x1b[B": "down", "\x1bOB": "down", "\x1b[C": "right", "\x1bOC": "right",
    "\x1b[D": "left", "\x1bOD": "left", "\x1b[5~": "pgup", "\x1b[6~": "pgdn", "\x1b[H": "home", "\x1bOH": "home",
    "\x1b[1~": "home", "\x1b[F": "end", "\x1bOF": "end", "\x1b[4~": "end",
}
KEYS_HELP = (
    ("up/down, j/k", "select an agent (in a view: scroll)"),
    ("enter", "its live stream: assistant text and tool calls as they happen"),
    ("d", "its diff against its base branch (ov diff)"),
    ("a", "attach to its tmux session (tmux mode; detach with C-b d)"),
    ("n", "nudge it, with an optional message"),
    ("m", "mail it a message"),
    ("s", "stop it (asks first)"),
    ("r", "resume it (ov resume)"),
    ("y / x", "approve / reject its pending gate (ov approve / ov reject)"),
    ("esc, q", "back to the list (in the list: q quits)"),
    ("?", "this help"),
)
FOOTER = "up/down select  enter stream  d diff  s stop  n nudge  m mail  ? keys  q quit"


def split_keys(data: str) -> list[str]:
    """One chunk read from the terminal as key names (``up``, ``enter``, ...) or single characters."""
    keys: list[str] = []
    index = 0
    while index < len(data):
        if data[index] == "\x1b":
            for sequence, name in KEY_SEQUENCES.items():
                if data.startswith(sequence, index):
                    keys.append(name)
                    index += len(sequence)
                    break
            else:
                keys.append("esc")
                index += 1
            continue
        char = data[index]
        keys.append({"\r": "enter", "\n": "enter", "\x7f": "backspace", "\x08": "backspace"}.get(char, char))
        index += 1
    return keys


class Terminal:
    """cbreak mode on the alternate screen; ``suspended`` hands the terminal back for a while."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self.saved: list[t.Any] | None = None

    def __enter__(self) -> Terminal:
        self.saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)
        self.write("\x1b[?1049h\x1b[?25l")
        return self

    def __exit__(self, *exc: object) -> None:
        self.write("\x1b[?25h\x1b[?1049l")
        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    @contextlib.contextmanager
    def suspended(self) -> t.Iterator[None]:
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def size(self) -> tuple[int, int]:
        size = shutil.get_terminal_size((80, 24))
        return max(size.columns, 20), max(size.lines, 8)

    def read_keys(self, timeout: float) -> list[str]:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if not ready:
            return []
        data = os.read(self.fd, 1024).decode("utf-8", errors="replace")
        return split_keys(data)

    def draw(self, lines: list[str]) -> None:
        self.write("\x1b[H" + "\r\n".join(line + "\x1b[K" for line in lines) + "\x1b[J")


@dataclass
class Prompt:
    label: str
    submit: t.Callable[[str], None]
    text: str = ""


@dataclass
class View:
    kind: str = "list"          # list | stream | diff | help
    agent: str | None = None
    lines: list[t.Any] = field(default_factory=list)
    scroll: int | None = None   # first line shown; None follows the end (stream)
    last_event: int = 0


class WatchApp:
    def __init__(self, project: ProjectPaths, state: sqlite3.Connection, events: sqlite3.Connection, *,
                 interval: float, note: t.Callable[[], str], include_completed: bool = True) -> None:
        self.project = project
        self.state = state
        self.events = events
        self.interval = interval
        self.note = note
        self.include_completed = include_completed
        self.runner = actions.Runner(project.root)
        self.view = View()
        self.selected: str | None = None
        self.first_row = 0
        self.status = ""
        self.prompt: Prompt | None = None
        self.confirm: tuple[str, t.Callable[[], None]] | None = None
        self.agents: list[dict[str, t.Any]] = []
        self.quit = False

    # ---- the loop ------------------------------------------------------------------------

    def run(self, terminal: Terminal) -> None:
        self.terminal = terminal
        next_refresh = 0.0
        while not self.quit:
            now = time.monotonic()
            if now >= next_refresh:
                next_refresh = now + (min(self.interval, STREAM_POLL) if self.view.kind == "stream" else self.interval)
            finished = self.runner.poll()
            if finished is not None:
                self.status = ("ok: " if finished.ok else "failed: ") + finished.message
            terminal.draw(self.screen(*terminal.size()))
            for key in terminal.read_keys(max(0.05, next_refresh - time.monotonic())):
                self.handle(key)
                if self.quit:
                    break

    # ---- keys ----------------------------------------------------------------------------

    def handle(self, key: str) -> None:
        if self.prompt is not None:
            return self._prompt_key(key)
        if self.confirm is not None:
            question, action = self.confirm
            self.confirm = None
            if key in ("y", "Y"):
                action()
            else:
                self.status = "cancelled"
            return
        if self.view.kind != "list":
            if key in ("esc", "q", "left", "backspace"):
                self.view = View()
                return
            if key in ("up", "k", "down", "j", "pgup", "pgdn", "home", "end"):
                return self._scroll(key)
        elif key in ("up", "k", "down", "j", "pgup", "pgdn", "home", "end"):
            return self._move(key)
        elif key == "q":
            self.quit = True
            return
        if key == "?":
            self.view = View("help", lines=[f"  {keys:<14} {what}" for keys, what in KEYS_HELP])
            return
        agent = self.view.agent or self.selected
        if agent is None:
            if key in ("enter", "d", "a", "n", "m", "s", "r", "y", "x"):
                self.status = "no agent selected"
            return
        handler = {"enter": self.open_stream, "d": self.open_diff, "a": self.attach, "n": self.ask_nudge,
                   "m": self.ask_mail, "s": self.ask_stop, "r": self.resume, "y": self.approve,
                   "x": self.reject}.get(key)
        if handler is not None:
            handler(agent)

    def _prompt_key(self, key: str) -> None:
        assert self.prompt is not None
        if key == "esc":
            self.prompt, self.status = None, "cancelled"
        elif key == "enter":
            prompt, self.prompt = self.prompt, None
            prompt.submit(prompt.text)
        elif key == "backspace":
            self.prompt.text = self.prompt.text[:-1]
        elif len(key) == 1 and key.isprintable():
            self.prompt.text += key

    def _move(self, key: str) -> None:
        names = [a["name"] for a in self.agents]
        if not names:
            return
        index = names.index(self.selected) if self.selected in names else 0
        step = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -10, "pgdn": 10, "home": -len(names),
                "end": len(names)}[key]
        self.selected = names[max(0, min(len(names) - 1, index + step))]

    def _scroll(self, key: str) -> None:
        height = self.terminal.size()[1] - 3
        top = self.view.scroll if self.view.scroll is not None else max(0, len(self.view.lines) - height)
        step = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -height, "pgdn": height, "home": -len(self.view.lines),
                "end": len(self.view.lines)}[key]
        top = max(0, min(max(0, len(self.view.lines) - height), top + step))
        at_end = top >= len(self.view.lines) - height
        self.view.scroll = None if (self.view.kind == "stream" and at_end) else top

    # ---- actions -------------------------------------------------------------------------

    def start(self, label: str, args: list[str]) -> None:
        if self.runner.start(label, args):
            self.status = label + " ..."
        else:
            self.status = f"busy: {self.runner.label} is still running"

    def open_stream(self, agent: str) -> None:
        from overstory.store import events as event_store

        found = event_store.query(self.events, agent=agent, limit=500, newest=True)
        self.view = View("stream", agent=agent, lines=[_event_line(e) for e in found],
                         last_event=found[-1].id if found else 0)

    def _poll_stream(self) -> None:
        from overstory.store import events as event_store

        found = event_store.query(self.events, agent=self.view.agent, after_id=self.view.last_event, limit=500)
        if found:
            self.view.lines += [_event_line(e) for e in found]
            self.view.last_event = found[-1].id

    def open_diff(self, agent: str) -> None:
        from overstory.errors import OrchestratorError
        from overstory.views.diffs import agent_diff

        try:
            text = agent_diff(self.project, self.state, agent)
        except OrchestratorError as exc:
            self.status = f"diff: {exc}"
            return
        self.view = View("diff", agent=agent, lines=text.splitlines() or [f"{agent} has no changes against its base"],
                         scroll=0)

    def attach(self, agent: str) -> None:
        row = next((a for a in self.agents if a["name"] == agent), None)
        if row is None or row["mode"] != "tmux":
            self.status = f"{agent} runs headless: there is no session to attach to; enter shows its stream"
            return
        with self.terminal.suspended():
            outcome = actions.run_foreground(self.project.root, ["attach", agent])
        self.status = outcome.message

    def ask_nudge(self, agent: str) -> None:
        self.prompt = Prompt(f"nudge {agent} (enter sends; optional message): ",
                             lambda text: self.start(f"nudging {agent}", ["nudge", agent, *([text] if text else [])]))

    def ask_mail(self, agent: str) -> None:
        def send(text: str) -> None:
            if not text.strip():
                self.status = "nothing to send"
                return
            self.start(f"mailing {agent}", ["mail", "send", "--to", agent, "--subject", text.strip()[:80],
                                            "--body", text])

        self.prompt = Prompt(f"mail to {agent}: ", send)

    def ask_stop(self, agent: str) -> None:
        self.confirm = (f"stop {agent}? y/n", lambda: self.start(f"stopping {agent}", ["stop", agent]))

    def resume(self, agent: str) -> None:
        self.start(f"resuming {agent}", ["resume", agent])

    def approve(self, agent: str) -> None:
        self._gate(agent, "approve")

    def reject(self, agent: str) -> None:
        self._gate(agent, "reject")

    def _gate(self, agent: str, verb: str) -> None:
        approval = actions.pending_approval(self.project.state_db, agent)
        if approval is None:
            self.status = f"{agent} has no pending gate"
            return
        if verb == "approve":
            self.start(f"approve {approval}", ["approve", approval])
            return

        def reject(text: str) -> None:  # the agent is told why: `ov reject` needs a reason
            if not text.strip():
                self.status = "not rejected: a reason is needed"
                return
            self.start(f"reject {approval}", ["reject", approval, "--reason", text.strip()])

        self.prompt = Prompt(f"reject {approval} of {agent}, because: ", reject)

    # ---- drawing -------------------------------------------------------------------------

    def screen(self, width: int, height: int) -> list[str]:
        from overstory.ui import dashboard as ui
        from overstory.views import status as core

        console = ui.console_for(width, terminal=True)
        snapshot = core.dashboard_snapshot(self.state, self.events, include_completed=self.include_completed)
        self.agents = ui.sort_agents(snapshot["agents"])
        names = [a["name"] for a in self.agents]
        if self.selected not in names:
            self.selected = names[0] if names else None
        lines = [ui.to_lines(console, line)[0] for line in (*ui.header_lines(snapshot, self.note(), width),
                                                             *ui.waiting_lines(snapshot, width))]
        footer = [self._status_line(console, width), ui.to_lines(console, ui.dim(FOOTER, width))[0]]
        room = height - len(lines) - len(footer)
        if self.view.kind == "list":
            lines += self._list_lines(console, ui, snapshot, width, room)
        else:
            if self.view.kind == "stream":
                self._poll_stream()
            lines += self._view_lines(console, ui, width, room)
        lines = lines[:height - len(footer)]
        return lines + [""] * (height - len(footer) - len(lines)) + footer

    def _list_lines(self, console: t.Any, ui: t.Any, snapshot: dict[str, t.Any], width: int, room: int) -> list[str]:
        rows = max(1, room - 2)
        if len(self.agents) > rows:
            rows = max(1, rows - 1)  # the "... more" caption
        index = next((i for i, a in enumerate(self.agents) if a["name"] == self.selected), 0)
        if index < self.first_row:
            self.first_row = index
        elif index >= self.first_row + rows:
            self.first_row = index - rows + 1
        self.first_row = max(0, min(self.first_row, max(0, len(self.agents) - rows)))
        table = ui.agents_table(self.agents, width, rows, selected=self.selected, first=self.first_row, marker=True)
        lines = ui.to_lines(console, table)
        for part in ui.extra_sections(snapshot, width):
            left = room - len(lines)
            if left < 4:
                break
            lines += ui.to_lines(console, part)[:left]
        return lines

    def _view_lines(self, console: t.Any, ui: t.Any, width: int, room: int) -> list[str]:
        agent = self.view.agent
        row = next((a for a in self.agents if a["name"] == agent), None)
        state = f" ({row['state']}, {row['turns']} turns)" if row else ""
        titles = {"stream": f"stream of {agent}{state}: esc back, other keys act on {agent}",
                  "diff": f"diff of {agent} against its base: up/down/pgup/pgdn scroll, esc back",
                  "help": "keys: esc back"}
        body_rows = max(1, room - 1)
        top = self.view.scroll if self.view.scroll is not None else max(0, len(self.view.lines) - body_rows)
        shown = self.view.lines[top:top + body_rows]
        body = [ui.to_lines(console, ui.view_line(line, width, diff=self.view.kind == "diff"))[0] for line in shown]
        return [ui.to_lines(console, ui.title(titles[self.view.kind], width))[0], *body]

    def _status_line(self, console: t.Any, width: int) -> str:
        from overstory.ui import dashboard as ui

        if self.prompt is not None:
            text = self.prompt.label + self.prompt.text + "_"
        elif self.confirm is not None:
            text = self.confirm[0]
        else:
            text = self.status
        return ui.to_lines(console, ui.title(text, width, bold=False))[0] if text else ""


def _event_line(event: t.Any) -> str:
    from overstory.clock import iso

    parts = [(iso(event.at) or "")[11:19], event.kind]
    if event.tool:
        parts.append(f"[{event.tool}]")
    if event.summary:
        parts.append(" ".join(event.summary.split()))
    return " ".join(parts)


def run_interactive(project: ProjectPaths, state: sqlite3.Connection, events: sqlite3.Connection, *,
                    interval: float, note: t.Callable[[], str], include_completed: bool) -> None:
    app = WatchApp(project, state, events, interval=interval, note=note, include_completed=include_completed)
    try:
        with Terminal() as terminal:
            app.run(terminal)
    except KeyboardInterrupt:
        pass
    finally:
        app.runner.wait(timeout=30)

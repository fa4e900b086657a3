"""Live events for every SSE client from one reader of events.db's cursor.

The hub asks events.db for ``id > cursor`` a few times a second (an index range on
the primary key: it never scans the table) and hands each batch, already formatted
as SSE frames, to every connected client. A client that resumes after event N first
reads ``id > N`` from the database in pages, then takes the hub's batches, skipping
ids it has already sent. It subscribes before it reads, and the hub only hands out
committed rows in id order, so every event reaches it exactly once: nothing is lost
between the two and nothing is sent twice.

Why ids are a safe cursor: SQLite has one writer at a time and a row's id is taken
inside the writing transaction, so a row with a higher id is never committed before
a lower one; events are never deleted, so ids are never reused.

A client too slow to take its batches (its queue fills) drops them and reads the gap
from the database again, so a slow browser costs memory for at most one queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import typing as t
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from overstory.errors import OrchestratorError
from overstory.store import events as event_store
from overstory.store.db import open_events

log = logging.getLogger("overstory.serve")

PAGE = 500  # rows per database read
QUEUE_BATCHES = 2000  # batches a client may fall behind before it re-reads from the database


@dataclass(frozen=True)
class Item:
    id: int
    agent: str | None
    kind: str
    frame: str  # "id: N\ndata: {...}\n\n"


def frame_of(event: event_store.Event) -> Item:
    data = json.dumps(event.as_dict(), ensure_ascii=False, default=str, separators=(",", ":"))
    return Item(event.id, event.agent, event.kind, f"id: {event.id}\ndata: {data}\n\n")


@dataclass(eq=False)
class Subscriber:
    queue: asyncio.Queue[list[Item] | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_BATCHES))
    lagging: bool = False

    def offer(self, batch: list[Item] | None) -> None:
        try:
            self.queue.put_nowait(batch)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            if batch is None:
                self.queue.put_nowait(None)
            else:
                self.lagging = True


class EventHub:
    """One cursor on events.db, fanned out to every subscriber."""

    def __init__(self, events_db: Path, *, interval: float = 0.2, idle_interval: float = 1.0) -> None:
        self.events_db = events_db
        self.interval = interval
        self.idle_interval = idle_interval
        self.cursor = 0
        self.subscribers: set[Subscriber] = set()
        self.stopping = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ov-serve-events")
        self._conn: sqlite3.Connection | None = None  # used only on the executor's one thread
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()

    # ---- the reader (on its own thread) --------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_events(self.events_db)
        return self._conn

    def _newest(self) -> int:
        return event_store.newest_id(self._connection())

    def _read(self, after: int) -> list[Item]:
        return [frame_of(e) for e in event_store.query(self._connection(), after_id=after, limit=PAGE)]

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- the loop --------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.cursor = await self._loop.run_in_executor(self._executor, self._newest)
        self._task = asyncio.create_task(self._run(), name="ov-serve-event-hub")

    async def _run(self) -> None:
        assert self._loop is not None
        failing = False
        while not self.stopping:
            try:
                batch = await self._loop.run_in_executor(self._executor, self._read, self.cursor)
                failing = False
            except (sqlite3.Error, OrchestratorError) as exc:
                if not failing:  # say it once, keep trying: the database may be busy or being replaced
                    log.warning("ov serve: cannot read events.db (%s); retrying", exc)
                failing = True
                await self._loop.run_in_executor(self._executor, self._close)
                batch = []
            if batch:
                self.cursor = batch[-1].id
                for subscriber in list(self.subscribers):
                    subscriber.offer(batch)
                if len(batch) == PAGE:
                    continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval if self.subscribers else self.idle_interval)

    def stop_soon(self) -> None:
        """Ask every stream to end (safe to call from a signal handler on the loop's thread)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        self.stopping = True
        self._wake.set()
        for subscriber in list(self.subscribers):
            subscriber.offer(None)

    async def close(self) -> None:
        self._stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._loop is not None:
            await self._loop.run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=False)

    async def newest(self) -> int:
        """The newest committed event id (a new client's starting point)."""
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, self._newest)

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        if self.stopping:
            subscriber.offer(None)
        self.subscribers.add(subscriber)
        self._wake.set()  # a first client should not wait out the idle interval
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)


def _matches(item: Item, agent: str | None, kinds: frozenset[str]) -> bool:
    return (agent is None or item.agent == agent) and (not kinds or item.kind in kinds)


def _read_page(events_db: Path, after: int, agent: str | None, kinds: frozenset[str]) -> list[Item]:
    conn = open_events(events_db)
    try:
        return [frame_of(e) for e in event_store.query(conn, agent=agent, kinds=kinds or None, after_id=after,
                                                       limit=PAGE)]
    finally:
        conn.close()


async def stream(hub: EventHub, subscriber: Subscriber, *, after: int, catch_up: bool, agent: str | None,
                 kinds: t.Collection[str], heartbeat: float) -> t.AsyncIterator[str]:
    """The SSE body for one client, subscribed when ``after`` was taken (so nothing after it is missed).

    ``catch_up``: first send what the database holds after ``after`` (a resuming client).
    """
    wanted = frozenset(kinds)
    sent = after
    try:
        yield "retry: 2000\n: connected\n\n"
        while True:
            if catch_up or subscriber.lagging:
                catch_up = subscriber.lagging = False
                while True:  # pages of id > sent straight from the database
                    page = await asyncio.to_thread(_read_page, hub.events_db, sent, agent, wanted)
                    if page:
                        sent = page[-1].id
                        yield "".join(item.frame for item in page)
                    if len(page) < PAGE:
                        break
            try:
                first = await asyncio.wait_for(subscriber.queue.get(), heartbeat)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if subscriber.lagging and first is not None:
                continue  # batches were dropped before this one: re-read the gap from the database first
            batches = [first]
            while not subscriber.queue.empty():
                batches.append(subscriber.queue.get_nowait())
            parts: list[str] = []
            ended = False
            for batch in batches:
                if batch is None:
                    ended = True
                    break
                for item in batch:
                    if item.id > sent:
                        sent = item.id
                        if _matches(item, agent, wanted):
                            parts.append(item.frame)
            if parts:
                yield "".join(parts)
            if ended:
                return
    finally:
        hub.unsubscribe(subscriber)

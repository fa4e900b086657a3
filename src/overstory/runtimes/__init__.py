"""Runtimes behind an agent: the command lines they are started with, and the built-in scripted one."""

from __future__ import annotations

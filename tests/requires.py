"""What a test needs from the machine, said one way: skipped on a developer's machine without it,
failed on CI (``CI=true``), where a skip would hide a missing install step behind a green run."""

from __future__ import annotations

import os
import shutil
import typing as t

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(message: str) -> t.NoReturn:
    """Inside a test or fixture: something the test needs is not here."""
    if on_ci():
        pytest.fail(f"{message} (CI=true: tests must not be skipped for a missing program)", pytrace=False)
    pytest.skip(message)


def requires(available: bool, message: str, *, e2e: bool = False) -> t.Callable[[t.Callable[..., t.Any]], t.Any]:
    """A decorator: run the test when ``available``; else skip it, or fail it under ``CI=true``."""

    def decorate(test: t.Callable[..., t.Any]) -> t.Any:
        marked: t.Any = test
        if not available:
            marked = pytest.mark.skip(reason=message)(test)
            if on_ci():
                def failing(*args: t.Any, **kwargs: t.Any) -> None:
                    missing(message)

                failing.__name__ = test.__name__
                failing.__doc__ = test.__doc__
                failing.__module__ = test.__module__
                marked = failing
        return pytest.mark.e2e(marked) if e2e else marked

    return decorate


def requires_program(program: str, package: str | None = None) -> t.Callable[[t.Callable[..., t.Any]], t.Any]:
    """Needs ``program`` on PATH (Debian package ``package``, default the program's name)."""
    return requires(shutil.which(program) is not None,
                    f"{program} is not installed (apt-get install {package or program})")


requires_tmux = requires_program("tmux")


def need_program(program: str, package: str | None = None) -> None:
    """The same check, from inside a test or fixture."""
    if shutil.which(program) is None:
        missing(f"{program} is not installed (apt-get install {package or program})")

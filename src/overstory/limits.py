"""Reading what a user points ov at without trusting its size or its shape.

``--body-file /dev/zero`` or ``--spec /dev/urandom`` must not make ov read forever or fill
its memory. Standard library only: `ov mail send` imports this.
"""

from __future__ import annotations

from overstory.errors import UsageError

TYPE_CHECKING = False  # typing costs milliseconds: `ov mail send` imports this module
if TYPE_CHECKING:
    import typing as t


def read_at_most(source: str | t.BinaryIO, limit: int, what: str) -> bytes:
    """Read ``source`` (a path or a binary stream), refusing anything larger than ``limit`` bytes.

    Reads at most ``limit + 1`` bytes, so an endless file costs no more than that.
    """
    try:
        if isinstance(source, str):
            with open(source, "rb") as handle:
                data = handle.read(limit + 1)
        else:
            data = source.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UsageError(f"{what} is larger than the limit of {limit} bytes ({_human(limit)}); "
                         "nothing was read past the limit and nothing was stored")
    return data


def _human(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB" if size % (1024 * 1024) == 0 else f"{size} bytes"

"""A progress bar for long work, on stderr: when stderr is a terminal, or when forced
(``--progress``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .render import shown

__all__ = ["make_progress", "Progress"]


class Progress:
    """Byte-count progress; uses rich when installed, else a plain one-line bar."""

    def __init__(self, total: int, label: str, *, force: bool = False) -> None:
        self.total = max(total, 1)
        self.label = shown(label)  # a destination's name: its controls escaped
        self.done = 0
        self.enabled = force or sys.stderr.isatty()
        self._rich = None
        self._last = 0.0
        if self.enabled and sys.stderr.isatty():  # forced onto a file or pipe: plain lines
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    TextColumn,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )
                from rich.progress import (
                    Progress as RP,
                )

                # stderr, never stdout: progress must not mix with results (--json)
                console = Console(file=sys.stderr)
                self._rich = RP(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(),
                    transient=True,
                    console=console,
                )
                self._rich.start()
                from rich.markup import escape

                self._task = self._rich.add_task(escape(self.label), total=self.total)  # "[red]" is text
            except ImportError:
                self._rich = None

    def __call__(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)
            return
        now = time.monotonic()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}%")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.stop()
        else:
            sys.stderr.write("\r" + " " * (len(self.label) + 45) + "\r")
            sys.stderr.flush()


def make_progress(total: int, label: str) -> Callable[[int], None]:
    return Progress(total, label)

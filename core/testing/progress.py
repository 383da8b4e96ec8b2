"""Progress of a conformance run on stderr: tqdm when installed, else a one-line counter."""

from __future__ import annotations

import sys

from dsa_runtime.testing.case import Case
from dsa_runtime.testing.report import CaseResult


class Progress:
    """tqdm when installed, else a one-line counter on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="case", file=sys.stderr, leave=False)
            except ImportError:
                self.bar = None

    def step(self, case: Case, res: CaseResult) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(case.id[-60:], refresh=False)
            self.bar.update(1)
        else:
            sys.stderr.write(f"\r\x1b[K[{self.done}/{self.total}] {res.status:<11} {case.id[-90:]}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

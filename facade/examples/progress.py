"""A one-line progress bar (steps, loss, samples/s) on rank 0; plain lines when stderr is not a terminal."""

import sys
import time


class ProgressBar:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, every: int = 25, width: int = 28):
        self.total, self.start, self.enabled, self.every, self.width = total, start, enabled, every, width
        self.tty = sys.stderr.isatty()
        self.began = time.perf_counter()
        self.samples = 0

    def update(self, step: int, loss: float, samples: int) -> None:
        self.samples += samples
        if not self.enabled:
            return
        rate = self.samples / max(time.perf_counter() - self.began, 1e-9)
        done = step / self.total
        bar = "=" * int(done * self.width)
        line = f"[{bar:<{self.width}}] step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f} samples/s"
        if self.tty:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        elif step % self.every == 0 or step == self.total:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")

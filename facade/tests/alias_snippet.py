"""Runs a script under `import dstrain.as_deepspeed` in a fresh interpreter (the alias is process-wide), with a free
port for its one-rank process group as argv[1]; the script prints "ok" last when every check held."""

import socket
import subprocess
import sys


def run_alias_snippet(snippet: str, cwd, timeout: float = 240) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", snippet, str(port)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]

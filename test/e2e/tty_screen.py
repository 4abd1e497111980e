#!/usr/bin/python3
"""Runs a command with stdout and stderr on a pseudo-terminal and prints what a terminal would
show once it ended: carriage returns overwrite, newlines start a line; other escape sequences are
not interpreted (a line cleared only by one shows what it left). Used by kiln_ops_cli.sh to see
that kiln-ops' progress line leaves nothing behind.

usage: tty_screen.py [--raw] TIMEOUT_S COMMAND [ARG...]; exits with the command's status (124
when it ran past TIMEOUT_S and was killed). --raw prints the bytes as written instead, with each
carriage return shown as "\\r" (so that a test can see the progress line was drawn).
"""
import os
import pty
import select
import subprocess
import sys
import time


def read_all(fd: int, proc: "subprocess.Popen[bytes]", timeout_s: float) -> tuple[bytes, bool]:
    """Everything written to the terminal until the command ends; (output, timed_out)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None:
                return b"".join(chunks), False
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            return b"".join(chunks), False
        if not data:
            return b"".join(chunks), False
        chunks.append(data)


def screen(output: bytes) -> list[str]:
    """The lines a terminal shows for `output` (\\r returns to column 0, \\n starts a line)."""
    lines: list[str] = []
    line: list[str] = []
    column = 0
    for ch in output.decode("utf-8", "replace"):
        if ch == "\n":
            lines.append("".join(line))
            line, column = [], 0
        elif ch == "\r":
            column = 0
        else:
            if column < len(line):
                line[column] = ch
            else:
                line.append(ch)
            column += 1
    if line:
        lines.append("".join(line))
    return [text.rstrip(" ") for text in lines]


def main() -> int:
    raw = sys.argv[1] == "--raw"
    args = sys.argv[2:] if raw else sys.argv[1:]
    timeout_s, command = float(args[0]), args[1:]
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    output, timed_out = read_all(controller, proc, timeout_s)
    os.close(controller)
    status = proc.wait()
    if raw:
        sys.stdout.write(output.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\\r"))
    else:
        for text in screen(output):
            print(text)
    return 124 if timed_out else status


if __name__ == "__main__":
    sys.exit(main())

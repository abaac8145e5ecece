#!/usr/bin/env python3
"""Drives a QEMU serial console on stdin/stdout: waits for patterns, types
lines (as a person at U-Boot's prompt would), and stops QEMU when the last
pattern shows, all within one time limit.

Usage:
  console.py --log LOG --limit SECONDS [STEP ...] -- QEMU-COMMAND...

Steps, run in order:
  --expect REGEX   wait for REGEX in the console output after the previous
                   match
  --send TEXT      type TEXT (\\r is Enter)
  --until REGEX    wait for REGEX, print the matching line on stdout, stop
                   QEMU and exit 0
  --fail REGEX     (anywhere) when the console shows REGEX, stop at once
                   and exit 1: the boot failed, no need to wait for the limit

Everything the console prints goes to LOG (carriage returns dropped); QEMU's
own stderr to LOG.qemu. Exit status: 0 the last step matched, 1 the time
limit hit or QEMU exited first (the last 60 lines of LOG on stderr), 2 a
usage error.
"""

import os
import re
import select
import signal
import subprocess
import sys
import time


def main(argv):
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1:]
    log = limit = None
    steps = []
    fail = None
    i = 0
    while i < len(opts):
        key = opts[i]
        if i + 1 >= len(opts):
            print(f"console.py: {key} needs a value", file=sys.stderr)
            return 2
        val = opts[i + 1]
        if key == "--log":
            log = val
        elif key == "--limit":
            limit = float(val)
        elif key in ("--expect", "--until"):
            steps.append((key[2:], re.compile(val)))
        elif key == "--fail":
            fail = re.compile(val)
        elif key == "--send":
            steps.append(("send", val.replace("\\r", "\r").replace("\\n", "\n")))
        else:
            print(f"console.py: unknown option {key}", file=sys.stderr)
            return 2
        i += 2
    if not log or limit is None or not cmd:
        print("console.py: --log, --limit and a command are needed", file=sys.stderr)
        return 2

    deadline = time.monotonic() + limit
    with open(log, "w", encoding="utf-8", errors="replace") as out, \
            open(log + ".qemu", "w") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True)
        text = ""
        pos = 0
        result = 1
        why = "time limit"
        try:
            for kind, arg in steps:
                if kind == "send":
                    proc.stdin.write(arg.encode())
                    proc.stdin.flush()
                    continue
                while True:
                    m = arg.search(text, pos)
                    if m:
                        pos = m.end()
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        why = f"time limit ({limit:.0f} s) waiting for /{arg.pattern}/"
                        raise TimeoutError
                    r, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
                    if r:
                        chunk = os.read(proc.stdout.fileno(), 65536)
                        if not chunk:
                            why = f"QEMU exited (status {proc.wait()}) before /{arg.pattern}/"
                            raise TimeoutError
                        s = chunk.decode("utf-8", errors="replace").replace("\r", "")
                        out.write(s)
                        out.flush()
                        text += s
                        bad = fail.search(text) if fail else None
                        if bad:
                            why = f"the console said /{fail.pattern}/ ({bad.group(0)!r})"
                            raise TimeoutError
                if kind == "until":
                    line_start = text.rfind("\n", 0, m.start()) + 1
                    line_end = text.find("\n", m.start())
                    print(text[line_start:line_end if line_end >= 0 else len(text)])
                    result = 0
                    break
            else:
                result = 0
        except TimeoutError:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if result != 0:
        print(f"console.py: {why}; the console's last lines:", file=sys.stderr)
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f.readlines()[-60:]:
                sys.stderr.write("  | " + line)
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

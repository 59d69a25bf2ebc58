#!/usr/bin/env python3
"""A fake `nvidia-smi` that replays a real capture (../shared/data/nvidia_smi/captures_raw/*.txt).

Use it as `nvidia-smi` in tests: `install(folder)` writes `folder/nvidia-smi`, a tiny sh wrapper that
runs this file with the test's own Python (`sys.executable -S`, so the venv's), and returns its path. Put
that folder first on PATH or pass the path (`--nvidia-smi PATH`, `Agent(nvidia_smi=...)`).

What it answers (read from the capture's sections `# <phase> :: <title>` / `# $ nvidia-smi <args>`):
- `--query-gpu=F1,F2,... --format=csv[,noheader][,nounits]`: the requested columns, in the requested order,
  projected from the phase's full `--query-gpu` CSV section. Values are printed as captured (`100 %`,
  `19818 MiB`, `[N/A]`); `nounits` strips the unit from each value but keeps `[unit]` in the header (as
  nvidia-smi does); `noheader` drops the header. A field the capture does not have exits 2 with
  `Field "x" is not a valid field to query.` (nvidia-smi's own message), so an agent asking for a field an
  old driver lacks fails as it would for real.
- `--query-compute-apps=F1,... --format=csv[...]`: the same, from the phase's compute-apps section.
- `-q`, `-L`, no arguments (the default table), `--version`, `topo -m`, ...: the section whose command is
  exactly those arguments, first in the phase (`idle`/`load`), else in `capabilities`.
- anything else: exit 2, `fake nvidia-smi: no section in <capture> for: <args>`.

Environment:
- FAKE_NVIDIA_SMI_CAPTURE: path of the capture file (required for idle/load).
- FAKE_NVIDIA_SMI_PHASE: one behaviour for every call (default `load`), unless a script is given.
- FAKE_NVIDIA_SMI_SCRIPT: path of a file with one behaviour per line, `#` comments and blank lines ignored.
  A line may end in `*N` to stand for N lines (`idle*3`) and may name another capture after the behaviour
  (`load /path/other.txt`). The script advances on each `--query-gpu` call (the first call of each sample
  of gpufinops' nvidia-smi reader, so one line = one sample; the other calls of that sample replay the
  same line); with FAKE_NVIDIA_SMI_ADVANCE=every it advances on every call. Past the last line, the last
  line repeats. The position is kept in FAKE_NVIDIA_SMI_COUNTER (default: `<script>.count`), locked, so
  concurrent calls each get their own line.
- FAKE_NVIDIA_SMI_LOG: if set, each call appends one line `<behaviour>\t<args joined by spaces>`.
- FAKE_NVIDIA_SMI_PIDS: if set, `hang` writes "<own pid> <child pid>" there (tests check both die).

Behaviours:
- `idle`, `load`: answer from that phase of the capture.
- `fail`: exit 9 with an NVML-like message on stderr (`Unable to determine the device handle for GPU...:
  Unknown Error`), as nvidia-smi does when the driver or a GPU has fallen off the bus.
- `hang`: start a child that sleeps and wait on it forever (only a process-group kill ends both).
- `garbage`: exit 0 printing a line that is not the asked format.

`parse_capture(path)` is also importable: {(phase, command): body} for tests that need the raw sections.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

BEHAVIOURS = ("idle", "load", "fail", "hang", "garbage")
RULE = "#" * 20  # a line of #s opens and closes each section header


def parse_capture(path: str | os.PathLike) -> dict[tuple[str, str], str]:
    """{(phase, args after `nvidia-smi`, stripped): body text} for each section with a `# $ nvidia-smi` line.

    A section is: a line of #s, `# <phase> :: <title>`, `# $ <command>`, a line of #s, then the body up to
    the next line of #s. Body lines may themselves start with `#` (pmon/dmon headers), so only #-rules
    delimit.
    """
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    sections: dict[tuple[str, str], str] = {}
    i = 0
    while i < len(lines):
        if (lines[i].startswith(RULE) and i + 3 < len(lines) and " :: " in lines[i + 1]
                and lines[i + 2].startswith("# $ ") and lines[i + 3].startswith(RULE)):
            phase = lines[i + 1][2:].split(" :: ", 1)[0].strip()
            command = lines[i + 2][4:].strip()
            j = i + 4
            while j < len(lines) and not lines[j].startswith(RULE):
                j += 1
            if command == "nvidia-smi" or command.startswith("nvidia-smi "):
                args = command[len("nvidia-smi"):].strip()
                sections.setdefault((phase, args), "\n".join(lines[i + 4:j]).strip("\n") + "\n")
            i = j
        else:
            i += 1
    return sections


def _csv_section(sections: dict[tuple[str, str], str], phase: str, option: str) -> str | None:
    for (p, args), body in sections.items():
        if p == phase and args.startswith(option + "="):
            return body
    return None


def _base(header_cell: str) -> tuple[str, str | None]:
    """'memory.used [MiB]' -> ('memory.used', 'MiB')."""
    cell = header_cell.strip()
    if cell.endswith("]") and " [" in cell:
        name, unit = cell[:-1].split(" [", 1)
        return name, unit
    return cell, None


def project_csv(body: str, fields: list[str], noheader: bool, nounits: bool) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a `--query-*=fields --format=csv...` answered from a full CSV body."""
    rows = [r for r in csv.reader(io.StringIO(body), skipinitialspace=True) if r and any(c.strip() for c in r)]
    if not rows:
        return 2, "", "fake nvidia-smi: empty CSV section\n"
    columns = [_base(h) for h in rows[0]]
    names = [name for name, _unit in columns]
    for f in fields:
        if f not in names:
            return 2, "", f'Field "{f}" is not a valid field to query.\n\n'
    picks = [names.index(f) for f in fields]
    out = []
    if not noheader:
        out.append(", ".join(rows[0][i].strip() for i in picks))
    for row in rows[1:]:
        cells = []
        for i in picks:
            value = row[i].strip() if i < len(row) else ""
            unit = columns[i][1]
            if nounits and unit and value.endswith(" " + unit):
                value = value[: -len(unit) - 1]
            cells.append(value)
        out.append(", ".join(cells))
    return 0, "".join(line + "\n" for line in out), ""


def answer(capture: str, phase: str, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `nvidia-smi argv` on the captured host in that phase."""
    sections = parse_capture(capture)
    queries = [a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))]
    if queries:
        option, value = queries[0].split("=", 1)
        formats = [a.split("=", 1)[1] for a in argv if a.startswith("--format=")]
        fmt = formats[0].split(",") if formats else []
        if "csv" not in fmt:
            return 2, "", "fake nvidia-smi: only --format=csv[,noheader][,nounits] is replayed\n"
        body = _csv_section(sections, phase, option)
        if body is None:
            return 2, "", f"fake nvidia-smi: no {option} section for {phase} in {capture}\n"
        return project_csv(body, [f.strip() for f in value.split(",") if f.strip()],
                           "noheader" in fmt, "nounits" in fmt)
    args = " ".join(argv).strip()
    for p in (phase, "capabilities"):
        if (p, args) in sections:
            return 0, sections[(p, args)], ""
    return 2, "", f"fake nvidia-smi: no section in {capture} for: {shlex.join(argv)}\n"


def _script_lines(script: str) -> list[tuple[str, str | None]]:
    """[(behaviour, capture or None)] with `*N` repeats expanded."""
    out = []
    for raw in Path(script).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        count = 1
        head, _, rest = line.partition(" ")
        if "*" in head:
            head, n = head.split("*", 1)
            count = int(n)
        if head not in BEHAVIOURS:
            raise SystemExit(f"fake nvidia-smi: {script}: unknown behaviour {head!r} (one of {BEHAVIOURS})")
        out.extend([(head, rest.strip() or None)] * count)
    return out


def _next_from_script(script: str, advance: bool) -> tuple[str, str | None]:
    import fcntl

    lines = _script_lines(script)
    if not lines:
        raise SystemExit(f"fake nvidia-smi: {script} lists no behaviour")
    counter = Path(os.environ.get("FAKE_NVIDIA_SMI_COUNTER") or script + ".count")
    with open(counter, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        seen = int(text) if text else 0  # how many advancing calls came before this one
        if advance:
            index, seen = seen, seen + 1
        else:
            index = max(seen - 1, 0)  # the line of the sample in progress
        f.seek(0)
        f.truncate()
        f.write(str(seen))
    return lines[min(index, len(lines) - 1)]


def _hang() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    pids = os.environ.get("FAKE_NVIDIA_SMI_PIDS")
    if pids:
        Path(pids).write_text(f"{os.getpid()} {child.pid}")
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> int:
    capture = os.environ.get("FAKE_NVIDIA_SMI_CAPTURE", "")
    script = os.environ.get("FAKE_NVIDIA_SMI_SCRIPT")
    if script:
        advance = os.environ.get("FAKE_NVIDIA_SMI_ADVANCE") == "every" or any(
            a.startswith("--query-gpu=") for a in argv)
        behaviour, override = _next_from_script(script, advance)
        capture = override or capture
    else:
        behaviour = os.environ.get("FAKE_NVIDIA_SMI_PHASE", "load")
        if behaviour not in BEHAVIOURS:
            print(f"fake nvidia-smi: FAKE_NVIDIA_SMI_PHASE={behaviour!r} is not one of {BEHAVIOURS}",
                  file=sys.stderr)
            return 2
    log = os.environ.get("FAKE_NVIDIA_SMI_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{behaviour}\t{' '.join(argv)}\n")
    if behaviour == "fail":
        print("Unable to determine the device handle for GPU0000:00:09.0: Unknown Error", file=sys.stderr)
        return 9
    if behaviour == "hang":
        _hang()
    if behaviour == "garbage":
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        return 0
    if not capture:
        print("fake nvidia-smi: set FAKE_NVIDIA_SMI_CAPTURE to a captures_raw/*.txt file", file=sys.stderr)
        return 2
    code, out, err = answer(capture, behaviour, argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


def install(folder: str | os.PathLike, python: str = sys.executable) -> Path:
    """Write `folder/nvidia-smi` (a sh wrapper running this file with `python`) and return its path."""
    path = Path(folder) / "nvidia-smi"
    # -S: no site packages to import (the fake needs the standard library only), a third of the start-up time.
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} -S {shlex.quote(str(Path(__file__).resolve()))} "$@"\n')
    path.chmod(0o755)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

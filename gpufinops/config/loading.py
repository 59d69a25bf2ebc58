"""Reading a config, rule or budget file: bounded and regular files only, UTF-8, YAML, and every failure a
ConfigError naming the file, the line and the dotted key (`line_of`, `format_validation_error`); where the shipped
folders (rules/, reports/) are. Imports nothing of gpufinops.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    import yaml

# PyYAML is imported by the functions that read YAML, not here: a command run without a config file (the
# built-in defaults) never parses YAML, and its import is a tenth of a command's start (bench_cli_start.py).

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def shipped_dir(name: str) -> Path:
    """A folder shipped beside the package: the checkout's rules/ or reports/ (editable install),
    else the copy a wheel installs under <prefix>/share/gpufinops/ (see pyproject data-files)."""
    for base in (PACKAGE_DIR.parent, Path(sys.prefix) / "share" / "gpufinops"):
        if (base / name).is_dir():
            return base / name
    return PACKAGE_DIR.parent / name


# The shipped default policies (rules/*.yaml) and report templates (reports/).
DEFAULT_RULES_DIR = shipped_dir("rules")
REPORTS_DIR = shipped_dir("reports")


class ConfigError(ValueError):
    """Bad configuration or rule file; the message names file, key and line."""


def compose_yaml(text: str) -> yaml.Node | None:
    """The YAML node tree (with line marks) of a document, or None when it has none."""
    import yaml

    try:
        return yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None


def line_of(path: str, loc: tuple, text: str, root: yaml.Node | None = None) -> int | None:
    """Best-effort line number of a dotted key in a YAML document (`root`: its compose_yaml(), if at hand)."""
    import yaml

    node = root if root is not None else compose_yaml(text)
    line = None
    for part in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    line = k.start_mark.line + 1
                    nxt = v
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def format_validation_error(path: str, text: str, err: ValidationError, prefix: tuple = ()) -> str:
    """One line per error: `file:line: key 'a.b.c': message`. `prefix` is where the validated
    data sits in the file (e.g. ("recommend",) for a capability's section)."""
    lines = []
    root = compose_yaml(text)
    for e in err.errors():
        loc = (*prefix, *e["loc"])
        key = ".".join(printable(str(p)) for p in loc) or "<root>"
        line = line_of(path, loc, text, root) if root is not None else None
        where = f"{path}:{line}" if line else path
        lines.append(f"{where}: key '{key}': {printable(e['msg'])}")
    return "\n".join(lines)


def printable(s: str) -> str:
    """A key or message on one line: a newline or control character in a YAML key is shown escaped."""
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


def decode_text(path: str | Path, data: bytes) -> str:
    """The UTF-8 text of a file's bytes, or a ConfigError naming the first bad byte, its offset and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def not_utf8_error(path: str | Path, chunk_size: int = 1 << 20) -> ConfigError:
    """For a file a reader (pandas) could not decode: where its first non-UTF-8 byte is, read in chunks."""
    start, line, pending = 0, 1, b""  # start: file offset of `pending`, the bytes not yet decoded
    try:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                data = pending + chunk
                try:
                    data.decode("utf-8")
                    good = len(data)
                except UnicodeDecodeError as exc:
                    if exc.end < len(data) or len(data) - exc.start > 3:  # a bad byte, not a cut sequence
                        line += data.count(b"\n", 0, exc.start)
                        return ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                           f"at offset {start + exc.start})")
                    good = exc.start  # a character cut by the chunk boundary: decode it with the next chunk
                line += data.count(b"\n", 0, good)
                start, pending = start + good, data[good:]
    except OSError as exc:
        return ConfigError(f"{path}: cannot read: {exc.strerror or exc}")
    if pending:
        return ConfigError(f"{path}:{line}: not UTF-8 text (truncated character at offset {start})")
    return ConfigError(f"{path}: not UTF-8 text")


# A config, rule or budget file is a few KiB. A bigger one is the wrong file (a log, a dump, /dev/zero, which
# never ends): refused before it is read into memory.
MAX_TEXT_FILE_BYTES = 4 * 2**20


def not_a_regular_file(path: str | Path) -> str:
    """Why `path` is not a regular file to read ("does not exist", "a folder", "not a regular file", the OS's
    words for a name too long...), or "" when it is one. Never raises."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    except ValueError:  # a NUL byte in the path
        return "not a valid path (NUL character)"
    if stat.S_ISREG(mode):
        return ""
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def read_text(path: str | Path) -> str:
    """A config, rule or budget file's text; every failure is a ConfigError naming the file. Only a regular file
    is read (a device or a pipe may never end), and at most MAX_TEXT_FILE_BYTES of it."""
    p = Path(path)
    why = not_a_regular_file(p)  # stat first: opening a pipe would wait for a writer
    if why:
        raise ConfigError(f"{printable(str(path))}: cannot read: {why}")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_TEXT_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{printable(str(p))}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"{path!r}: cannot read: {exc}") from None
    if len(data) > MAX_TEXT_FILE_BYTES:
        raise ConfigError(f"{printable(str(p))}: larger than {MAX_TEXT_FILE_BYTES // 2**20} MiB: not a config, "
                          "rule or budget file")
    return decode_text(p, data)


def parse_yaml(where: str | Path, text: str) -> Any:
    """yaml.safe_load, with every failure a ConfigError naming the file and, where YAML knows it, the line."""
    return parse_yaml_tree(where, text)[0]


def parse_yaml_tree(where: str | Path, text: str) -> tuple[Any, yaml.Node | None]:
    """parse_yaml's data and the document's node tree (its line marks: `line_of`'s `root`), from one reading: what
    yaml.safe_load does (compose the document, then construct it), keeping the nodes, so that a caller that wants
    lines does not read the text a second time. (PyYAML's C reader, CSafeLoader, was tried: it reads some documents
    otherwise than the pure-Python one, e.g. tabs, a byte-order mark inside the text, `!` alone, `?` in a flow
    mapping, so it would change what a file means.)"""
    import yaml

    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is None and isinstance(exc, yaml.reader.ReaderError):  # a control character
            line = text.count("\n", 0, exc.position) + 1
            char = ord(exc.character) if isinstance(exc.character, str) else int(exc.character)
            raise ConfigError(f"{where}:{line}: invalid YAML: unacceptable character "
                              f"#x{char:04x} at offset {exc.position}") from None
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}{line}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. a date like 2024-13-45 that YAML types as a date
        raise ConfigError(f"{where}: invalid YAML value: {exc}") from None
    # A merge key (`<<: *defaults`) makes the constructor rewrite the mapping it sits in: such a document's lines
    # are read from a tree composed afresh, as compose_yaml gives it.
    return data, (compose_yaml(text) if root is not None and "<<" in text else root)


def load_yaml(path: str | Path) -> tuple[Any, str]:
    p = Path(path)
    text = read_text(p)
    return parse_yaml(p, text), text


# Bidirectional controls (U+061C, U+200E/F, U+202A-E, U+2066-9): they make a value read differently from what it
# holds ("Trojan Source"); no setting needs one.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def text_problem(s: str) -> str | None:
    """Why a string cannot be a setting (a NUL, a control character, a bidirectional override), or None.
    No setting is free text: names, paths, URLs, channels, domains are all one printable line."""
    if "\x00" in s:
        return "holds a NUL character"
    if s and not s.strip():
        return "is only blanks (write nothing, or a value)"
    for c in s:
        if c in _BIDI:
            return f"holds a bidirectional control character (U+{ord(c):04X})"
        if unicodedata.category(c) == "Cc":
            return f"holds a control character (U+{ord(c):04X})"
    return None


def unsafe_text_locations(node: Any, loc: tuple = ()) -> list[tuple[tuple, str]]:
    """Where a YAML document holds a string (key or value) that `text_problem` refuses, and why."""
    out: list[tuple[tuple, str]] = []
    if isinstance(node, str):
        why = text_problem(node)
        return [(loc, why)] if why else []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and (why := text_problem(k)):
                out.append(((*loc, k), why))
            out.extend(unsafe_text_locations(v, (*loc, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(unsafe_text_locations(v, (*loc, i)))
    return out

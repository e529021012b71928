"""benchmarks/RESULTS.md holds one section per benchmark script between its own
markers; each script rewrites only its section. Also the machine description
the scripts print beside their numbers."""

import os
import platform


def write_section(path: str, begin: str, end: str, section: str) -> None:
    """Replaces the text from `begin` to `end` in `path` with `section` (which
    starts with `begin` and ends with `end`), or appends it; atomically."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n\n"
    start, stop = text.find(begin), text.find(end)
    if start >= 0 and stop > start:
        text = text[:start] + section.rstrip("\n") + text[stop + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def publish(path: str, begin: str, end: str, section: str) -> None:
    """Prints `section` and, unless `path` is empty, writes it there (`write_section`)."""
    print("\n" + section)
    if path:
        write_section(path, begin, end, section)
        print(f"wrote {path}")


def table_and_notes(header, rows, notes) -> list:
    """Markdown lines: a table of `rows` (cell lists; a "|" inside a cell
    becomes "/"), then a Notes list (or "none")."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in rows]
    return lines + ["", "Notes:", ""] + ([f"- {n.replace('|', '/')}" for n in notes]
                                         or ["- none."])


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

"""docs/benchmarks.md is written by several scripts: bench/run.py owns the file, and each script
named in a section's begin marker below (bench/egress.py, bench/previews.py, bench/idle_scale.py,
...; their figures written by hand) owns the section between its markers, and so does run.py's
comparison of runsc builds (--only gvisor_runsc).
These helpers keep each one's part when another rewrites the file."""
from __future__ import annotations

from pathlib import Path

# (begin prefix, end) of the sections the other scripts own, in file order.
SECTIONS = [
    ("<!-- egress benchmark: begin", "<!-- egress benchmark: end -->"),
    ("<!-- microvm benchmark: begin", "<!-- microvm benchmark: end -->"),
    ("<!-- js benchmark: begin", "<!-- js benchmark: end -->"),
    ("<!-- gvisor runsc benchmark: begin", "<!-- gvisor runsc benchmark: end -->"),
    ("<!-- processes benchmark: begin", "<!-- processes benchmark: end -->"),
    ("<!-- interpreter benchmark: begin", "<!-- interpreter benchmark: end -->"),
    ("<!-- interpreter first cell benchmark: begin", "<!-- interpreter first cell benchmark: end -->"),
    ("<!-- lifecycle benchmark: begin", "<!-- lifecycle benchmark: end -->"),
    ("<!-- sdk start benchmark: begin", "<!-- sdk start benchmark: end -->"),
    ("<!-- create exec before after: begin", "<!-- create exec before after: end -->"),
    ("<!-- tenants benchmark: begin", "<!-- tenants benchmark: end -->"),
    ("<!-- fleet creates benchmark: begin", "<!-- fleet creates benchmark: end -->"),
    ("<!-- fleet forward benchmark: begin", "<!-- fleet forward benchmark: end -->"),
    ("<!-- live restore benchmark: begin", "<!-- live restore benchmark: end -->"),
    ("<!-- quiet exec benchmark: begin", "<!-- quiet exec benchmark: end -->"),
    ("<!-- warm pool benchmark: begin", "<!-- warm pool benchmark: end -->"),
    ("<!-- file links benchmark: begin", "<!-- file links benchmark: end -->"),
    ("<!-- previews benchmark: begin", "<!-- previews benchmark: end -->"),
    ("<!-- images benchmark: begin", "<!-- images benchmark: end -->"),
    ("<!-- images cold benchmark: begin", "<!-- images cold benchmark: end -->"),
    ("<!-- idle scale benchmark: begin", "<!-- idle scale benchmark: end -->"),
    ("<!-- computer use benchmark: begin", "<!-- computer use benchmark: end -->"),
    ("<!-- volumes benchmark: begin", "<!-- volumes benchmark: end -->"),
    ("<!-- image recipes benchmark: begin", "<!-- image recipes benchmark: end -->"),
]


def kept_sections(text: str) -> str:
    """The marked sections of text, each with its markers, for run.py to
    carry over."""
    out = []
    for b, e in SECTIONS:
        if b in text and e in text:
            out.append(text[text.index(b):text.index(e) + len(e)])
    return "".join("\n" + s + "\n" for s in out)


def replace_section(path: Path, begin: str, end: str, section: str) -> None:
    """Puts section (markers included) in place of the one between begin and
    end in path, or appends it."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def emit(out: str, begin: str, end: str, section: str) -> None:
    """Prints section, and puts it in place in the file `out` unless that
    is "-"."""
    if out != "-":
        replace_section(Path(out), begin, end, section)
    print(section)

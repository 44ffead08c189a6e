"""What ``python -m tools.runtimes --runtime NAME --merge`` keeps of the RUNTIMES.md it rewrites:
the summary rows and the sections of the runtimes it does not measure, as they were written.

Rules: a kept row's cells are found by their column's header, so a column the old file did not
have (a variant added since) reads ``-``, not measured; a kept section states the run it came from
(its date and commit, added where it did not say); what follows the sections (the family's) is kept
whole. A file that is not such a report, or of the other mode (``--quick`` or not), is refused.
"""

from __future__ import annotations

__all__ = ["Kept", "read"]

import dataclasses
import re

_WRITTEN = re.compile(r"^Written by `python -m tools\.runtimes([^`]*)` on (\d{4}-\d\d-\d\d \d\d:\d\d UTC)")
_COMMIT = re.compile(r"^\| dql_pass commit \| (.*) \|$", re.M)
_SUMMARY = re.compile(r"^All inputs, opset (\d+):$")
_NOT_INSTALLABLE = re.compile(r"^Runtimes not installable here: (.*?)\.(?: |$)", re.M)
_UNKNOWN = re.compile(r"\*\*UNKNOWN difference\*\* on (\d+) inputs")
_MEASURED = re.compile(r"^(Version .*; measured in \d+ s)(.*)$")
RUN = re.compile(r" in the run of \d{4}-\d\d-\d\d \d\d:\d\d UTC at commit ")


@dataclasses.dataclass
class Kept:
    """The parts of a report that a run of other runtimes keeps."""

    quick: bool  # written by a --quick run
    run: str  # "in the run of DATE at commit C": the run that wrote it, for its sections that do not say
    rows: dict[int, dict[str, dict[str, str]]]  # opset -> runtime -> column header -> cell
    sections: dict[str, list[str]]  # runtime -> the lines of its section, "### name" first
    tail: list[str]  # the lines after the sections (from the next "## " heading), kept whole
    not_installable: list[str]

    def row(self, opset: int, name: str, headers: list[str]) -> list[str] | None:
        """The kept row of ``name`` at ``opset`` in the columns ``headers``; None where it had none."""
        cells = self.rows.get(opset, {}).get(name)
        return None if cells is None else [cells.get(header, "-") for header in headers]

    def unknown(self, name: str) -> int:
        """The inputs the kept section of ``name`` says differ for no known reason."""
        return sum(int(count) for line in self.sections.get(name, []) for count in _UNKNOWN.findall(line))


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().removeprefix("|").removesuffix("|").split(" | ")]


def read(text: str, quick: bool) -> Kept:
    """The parts of the report ``text`` to keep; ValueError, one line, when it is not such a report
    or of the other mode than ``quick``."""
    lines = text.splitlines()
    written = next((m for line in lines if (m := _WRITTEN.match(line))), None)
    if written is None or "## Per runtime" not in lines:
        raise ValueError("it is not a report of tools.runtimes (no 'Written by' line or no '## Per runtime')")
    if ("--quick" in written.group(1)) != quick:
        raise ValueError("it was written by a run of the other mode (--quick or not); rewrite it whole")
    commit = _COMMIT.search(text)
    run = f" in the run of {written.group(2)} at commit {commit.group(1) if commit else 'unknown'}"
    rows: dict[int, dict[str, dict[str, str]]] = {}
    for i, line in enumerate(lines):
        if (summary := _SUMMARY.match(line)) and i + 2 < len(lines):
            headers, table = _cells(lines[i + 2]), rows.setdefault(int(summary.group(1)), {})
            for row in lines[i + 4:]:
                if not row.startswith("| `"):
                    break
                cells = _cells(row)
                if len(cells) != len(headers):
                    raise ValueError(f"a summary row has {len(cells)} cells for {len(headers)} columns: {row[:80]}")
                table[cells[0].strip("`")] = dict(zip(headers, cells))
    start = lines.index("## Per runtime") + 1
    end = next((j for j in range(start, len(lines)) if lines[j].startswith("## ")), len(lines))
    sections: dict[str, list[str]] = {}
    for line in lines[start:end]:
        if line.startswith("### "):
            sections[line.removeprefix("### ").strip()] = []
        if sections:
            section = sections[next(reversed(sections))]
            # A section says the run it came from: one written before sections said it gets the file's.
            measured = _MEASURED.match(line)
            section.append(f"{measured.group(1)}{run}{measured.group(2)}"
                           if measured and not RUN.search(line) else line)
    not_installable = _NOT_INSTALLABLE.search(text)
    return Kept(quick, run, rows, sections, lines[end:],
                [n.strip() for n in not_installable.group(1).split(",")
                 if n.strip() and n.strip() != "none"] if not_installable else [])

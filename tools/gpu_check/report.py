"""The GPU check's record: checks (passed / failed / skipped, each with its reason) and figures (a median
beside its anchor, the ratio and the target), written as gpu_report.json and gpu_report.md.

Plain Python (no torch): it runs before the libraries are installed and in the lint session's tests.
"""

from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
SCHEMA = 1


@dataclass
class Check:
    name: str
    group: str
    status: str  # PASSED, FAILED or SKIPPED
    reason: str = ""  # why it failed or was skipped (the first lines of the error)
    seconds: float = 0.0


@dataclass
class Figure:
    """One benchmark's median against its anchor measured in the same run. `ratio` is ours over the anchor
    for times and for rates alike, so `target` reads e.g. '<= 0.8' (a time) or '>= 0.5' (a rate)."""

    name: str
    status: str  # "measured", "skipped" or "failed"
    value: float | None = None
    unit: str = ""
    anchor: str = ""
    anchor_value: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    runs: int = 0
    command: str = ""
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Figure:
        known = {k: v for k, v in data.items() if k in Figure.__dataclass_fields__}
        figure = Figure(**known)
        if figure.status == "measured" and figure.ratio is not None and figure.target and figure.met is None:
            figure.met = meets(figure.ratio, figure.target)
        return figure


def meets(ratio: float, target: str) -> bool:
    """Whether `ratio` satisfies a target written '<= 0.8' or '>= 2'."""
    op, _, bound = target.strip().partition(" ")
    if op not in ("<=", ">=") or not bound:
        raise ValueError(f"target {target!r}: expected '<= number' or '>= number'")
    return ratio <= float(bound) if op == "<=" else ratio >= float(bound)


@dataclass
class Report:
    mode: str  # "gpu" or "dry-run"
    started: str
    machine: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)  # name, status, seconds, log file
    finished: str = ""
    complete: bool = False  # False while running, and in a report left by a run that was killed

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAILED]

    @property
    def verdict(self) -> str:
        if not self.complete:
            return "incomplete"
        return "failed" if self.failed else "passed"

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        data = {"schema": SCHEMA, "verdict": self.verdict, **asdict(self)}
        _atomic(folder / "gpu_report.json", json.dumps(data, indent=2) + "\n")
        _atomic(folder / "gpu_report.md", self.markdown())

    def markdown(self) -> str:
        counts = {s: sum(1 for c in self.checks if c.status == s) for s in (PASSED, FAILED, SKIPPED)}
        what = "GPU run" if self.mode == "gpu" else "CPU dry run (CUDA steps skipped, GPU tests rehearsed on the CPU)"
        lines = [f"# dstrain GPU check: {self.verdict}", "",
                 f"{what}; started {self.started}, finished {self.finished or '(not finished)'}.",
                 f"Checks: {counts[PASSED]} passed, {counts[FAILED]} failed, {counts[SKIPPED]} skipped.", ""]
        if self.machine:
            lines += ["## Machine", "", "| | |", "|---|---|"]
            lines += [f"| {key} | {_cell(value)} |" for key, value in self.machine.items()]
            lines.append("")
        lines += ["## Figures", ""]
        if self.figures:
            lines += ["| figure | median | anchor (same run) | ratio | target | met | runs | note |",
                      "|---|---|---|---|---|---|---|---|"]
            for f in self.figures:
                value = f"{f.value:.4g} {f.unit}" if f.value is not None else "-"
                anchor = f"{f.anchor}: {f.anchor_value:.4g} {f.unit}" if f.anchor_value is not None else f.anchor or "-"
                ratio = f"{f.ratio:.3g}" if f.ratio is not None else "-"
                met = {True: "yes", False: "**no**", None: "-"}[f.met]
                note = f.reason if f.status != "measured" else (f"`{f.command}`" if f.command else "")
                lines.append(f"| {f.name} | {value} | {anchor} | {ratio} | {f.target or '-'} | {met} | {f.runs} | "
                             f"{_cell(note)} |")
        else:
            lines.append("(none)")
        lines += ["", "## Checks", "", "| status | group | check | seconds | reason |", "|---|---|---|---|---|"]
        order = {FAILED: 0, SKIPPED: 1, PASSED: 2}
        for c in sorted(self.checks, key=lambda c: (order.get(c.status, 3), c.group, c.name)):
            status = f"**{c.status}**" if c.status == FAILED else c.status
            lines.append(f"| {status} | {c.group} | {_cell(c.name)} | {c.seconds:.1f} | {_cell(c.reason)} |")
        lines += ["", "## Steps", "", "| step | status | seconds | log |", "|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s.get('log', '')} |" for s in self.steps]
        return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def _atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def junit_checks(path: Path, group: str | None = None, rehearsal: bool = False) -> list[Check]:
    """One Check per test case of a pytest --junitxml file, in `group` (default: the test's file, from its
    class name). In a rehearsal (the CPU standing in for the GPU) a test that passed is still no GPU result:
    it is recorded as skipped, saying the rehearsal passed."""
    checks = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = f"{classname.rpartition('.')[2]}::{case.get('name', '')}".lstrip(":")
        seconds = float(case.get("time") or 0.0)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            text = (problem.get("message") or problem.text or "").strip()
            status, reason = FAILED, ("rehearsal on the CPU failed: " if rehearsal else "") + _first_lines(text)
        elif skipped is not None:
            status, reason = SKIPPED, _skip_reason(skipped)
        elif rehearsal:
            status, reason = SKIPPED, "no CUDA GPU here; rehearsed on the CPU: passed"
        else:
            status, reason = PASSED, ""
        checks.append(Check(name, group or classname.replace(".", "/") + ".py", status, reason, seconds))
    return checks


def _skip_reason(element: ET.Element) -> str:
    text = element.get("message") or element.text or ""
    # pytest writes "file:line: reason" into the element's text and the bare reason into message
    return _first_lines(text.removeprefix("Skipped: "))


def _first_lines(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][:lines]
    return " / ".join(kept)


def python_summary() -> dict[str, str]:
    return {"python": platform.python_version(), "platform": platform.platform()}

"""Turns run.sh's JUnit reports into results.md: per file, how many tests pass, fail and skip, why each skips,
and every failure's first line. Usage: summarize.py FILES_TXT RESULTS_DIR DEEPSPEED_COMMIT > results.md"""

from __future__ import annotations

import collections
import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _listed(files_txt: Path) -> list[tuple[str, str]]:
    rows = []
    for line in files_txt.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, feature = line.partition(" ")
            rows.append((path, feature.strip()))
    return rows


def _first_line(text: str | None, limit: int = 150) -> str:
    line = next((part.strip() for part in _ANSI.sub("", text or "").splitlines() if part.strip()), "")
    line = line.replace("|", "/")
    return line if len(line) <= limit else line[: limit - 3] + "..."


_VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)")


def _from_log(log: Path, outcome: dict) -> None:
    """What a file's run had finished when it was stopped (no JUnit report then), from pytest's verbose lines;
    the test running when it was stopped is counted as failed, "hung: stopped by the file's timeout"."""
    if not log.exists():
        return
    last = None
    for line in _ANSI.sub("", log.read_text(errors="replace")).splitlines():
        match = _VERBOSE_LINE.match(line)
        if match:
            test, status = match.groups()
            key = {"PASSED": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped"}[status]
            outcome[key] += 1
            if key == "failed":
                outcome["failures"].append((test.split("::", 1)[1], "(see the log: the run was stopped)"))
            elif key == "skipped":
                outcome["skips"]["(reason in the log: the run was stopped)"] += 1
            last = None
        elif re.match(r"^\S+::\S+ *$", line.strip()):
            last = line.strip()
    if last:
        outcome["failed"] += 1
        outcome["failures"].append((last.split("::", 1)[1], "hung: stopped by the file's timeout"))


def _hangs(files_txt: Path) -> list[tuple[str, str]]:
    """hangs.txt beside files.txt: (test id, reason) of the tests run.sh deselects because they hang the harness."""
    hangs = files_txt.with_name("hangs.txt")
    if not hangs.is_file():
        return []
    return [(test, reason.strip()) for line in hangs.read_text().splitlines()
            if line.strip() and not line.startswith("#") for test, _, reason in [line.strip().partition(" ")]]


def _file_result(results: Path, path: str, hangs: list[tuple[str, str]] = ()) -> dict:
    name = path.replace("/", "__")
    outcome = {"passed": 0, "failed": 0, "skipped": 0, "skips": collections.Counter(), "failures": [], "note": ""}
    rc_run = (results / f"{name}.rc").exists()
    for test, reason in hangs:  # deselected by run.sh: counted as failed, with why
        if rc_run and test.startswith(f"{path}::"):
            outcome["failed"] += 1
            outcome["failures"].append((test.split("::", 1)[1], f"deselected (it hangs DeepSpeed's harness): {reason}"))
    rc_file, xml_file = results / f"{name}.rc", results / f"{name}.xml"
    rc = int(rc_file.read_text()) if rc_file.exists() else None
    if rc in (124, 137):
        outcome["note"] = "timed out (the file's run was stopped)"
    if not xml_file.exists():
        if rc is None:
            outcome["note"] = "not run"
            return outcome
        _from_log(results / f"{name}.log", outcome)
        outcome["note"] = outcome["note"] or f"no report (exit status {rc})"
        return outcome
    for case in ElementTree.parse(xml_file).getroot().iter("testcase"):
        test = case.get("name", "")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            outcome["failed"] += 1
            message = failed.get("message") or failed.text
            where = test if case.get("classname") else f"collection of {path}"
            outcome["failures"].append((where, _first_line(message)))
        elif skipped is not None:
            outcome["skipped"] += 1
            reason = _first_line(skipped.get("message"), 200)
            outcome["skips"][re.sub(r"^Skipped: ", "", reason)] += 1
        else:
            outcome["passed"] += 1
    return outcome


def main(files_txt: str, results_dir: str, commit: str) -> None:
    results = Path(results_dir)
    hangs = _hangs(Path(files_txt))
    rows = [(path, feature, _file_result(results, path, hangs)) for path, feature in _listed(Path(files_txt))]
    total = collections.Counter()
    for _, _, outcome in rows:
        total.update({key: outcome[key] for key in ("passed", "failed", "skipped")})
    ran = total["passed"] + total["failed"]
    print("# DeepSpeed's unit tests under dstrain: results\n")
    print(f"DeepSpeed commit `{commit}`, `tests/unit/`, the {len(rows)} files of `files.txt`, run by `run.sh` "
          f"(generated by `summarize.py`; the README beside them says how and what is left out).\n")
    share = f" ({100 * total['passed'] / ran:.0f}% of those that ran)" if ran else ""
    run_files = sum(1 for _, _, outcome in rows if outcome["note"] != "not run")
    print(f"{run_files} of the {len(rows)} files were run; the others are marked \"not run\".\n")
    print(f"**{total['passed']} passed, {total['failed']} failed or errored{share}, {total['skipped']} skipped.**\n")
    findings = Path(files_txt).with_name("findings.md")
    if findings.is_file():  # the hand-written account of what the failures are and what was fixed
        print(findings.read_text().rstrip() + "\n")
    print("## Per file\n")
    print("| feature | file | passed | failed | skipped | why skipped |")
    print("|---|---|---:|---:|---:|---|")
    for path, feature, outcome in rows:
        reasons = "; ".join(f"{count} x {reason}" if count > 1 else reason
                            for reason, count in outcome["skips"].most_common())
        notes = "; ".join(part for part in (outcome["note"], reasons) if part)
        print(f"| {feature} | `{path}` | {outcome['passed']} | {outcome['failed']} | {outcome['skipped']} | {notes} |")
    print("\n## Failures\n")
    for path, _, outcome in rows:
        if outcome["failures"]:
            print(f"### `{path}`\n")
            for test, message in outcome["failures"]:
                print(f"- `{test}`: {message}")
            print()


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""A check's files packed for one device call: the report, a README naming card, versions, commit and each part's
status, the measured parallel figure, one tarball of the logs, results and reports, and the study's report files in
the slots left, never more files than ``--max-files``."""

from __future__ import annotations

import argparse
import shutil
import tarfile
from pathlib import Path
from typing import Any

from nmt.common.files import write_json_durably, write_text_durably
from nmt_tools.gpu_check.registry import names

TAR_MAX_BYTES = 48 << 20  # uncompressed logs and reports in the tarball (text: a few MiB compressed)
TAR_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".md", ".png", ".yaml", ".csv", ".de", ".en")


def part_status(figures: Any) -> str:
    """``done``, or the skip, stop or failure a part's figures record."""
    if isinstance(figures, dict):
        for key in ("skipped", "stopped", "failed"):
            if key in figures:
                return f"{key}: {figures[key]}"
    return "done"


def pack(args: argparse.Namespace, report: dict[str, Any], argv: list[str]) -> list[Path]:
    """At most ``--max-files`` files into ``args.pack``: gpu_check.json, README.md, measured_parallel.json (when the
    parallel part wrote it), gpu_check_files.tar.gz (the logs, results and reports under ``--out``), and the
    study's report files in the slots left."""
    dest, out = args.pack, args.out
    dest.mkdir(parents=True, exist_ok=True)
    written = [write_json_durably(dest / "gpu_check.json", report)]
    if (out / "measured_parallel.json").is_file():
        written.append(Path(shutil.copyfile(out / "measured_parallel.json", dest / "measured_parallel.json")))
    tarball, left_out = dest / "gpu_check_files.tar.gz", []
    members, total = [], 0
    candidates = [p for p in sorted(out.rglob("*")) if p.is_file() and p.suffix in TAR_SUFFIXES
                  and "checkpoints" not in p.relative_to(out).parts]
    for path in sorted(candidates, key=lambda p: p.stat().st_size):
        size = path.stat().st_size
        if total + size > TAR_MAX_BYTES:
            left_out.append(f"{path.relative_to(out)} ({size} bytes)")
            continue
        members.append(path)
        total += size
    with tarfile.open(tarball, "w:gz") as tar:
        for path in sorted(members):
            tar.add(path, arcname=str(Path("gpu_check") / path.relative_to(out)))
    written.append(tarball)
    slots = args.max_files - len(written) - 1  # README.md last
    study = [out / "study" / name for name in (report.get("study") or {}).get("report_files", [])]
    copied = [Path(shutil.copyfile(path, dest / path.name)) for path in study[:max(0, slots)]]
    written += copied
    written.append(write_text_durably(dest / "README.md", readme(args, report, argv, written, left_out)))
    files = sorted(p.name for p in dest.iterdir())
    if len(files) > args.max_files:
        raise SystemExit(f"gpu_check.py: {dest} holds {len(files)} files, more than the {args.max_files} a device call "
                         f"brings back: {', '.join(files)}")
    return written


def readme(args: argparse.Namespace, report: dict[str, Any], argv: list[str], files: list[Path],
           left_out: list[str]) -> str:
    """README.md of a packed check: card, versions, commit, the command, each part's status, each file."""
    machine = report.get("machine", {})
    lines = [f"# GPU check: {machine.get('card') or 'no GPU'}, project {machine.get('commit', 'unknown')}", "",
             f"PyTorch {machine.get('pytorch')}, CUDA {machine.get('cuda')}, cuDNN {machine.get('cudnn')}, Python "
             f"{machine.get('python')}; measured {machine.get('date')}.", "",
             "```", " ".join(["python scripts/gpu_check.py", *argv]), "```", "",
             "| part | seconds | status |", "| --- | ---: | --- |"]
    seconds = report.get("seconds", {})
    lines += [f"| {part} | {seconds.get(part, 0.0):.0f} | {part_status(report[part])} |"
              for part in names() if part in report]
    what = {"gpu_check.json": "every part's figures, the machine and the commit",
            "measured_parallel.json": "the best count of trainings at once on this card, for nmt/chain/",
            "gpu_check_files.tar.gz": "the runs' logs, results.json, train logs, benchmark reports and translations, "
                                      "the CUDA tests' output, the study's reports (no checkpoints)",
            "README.md": "this file"}
    lines += ["", "| file | what it is |", "| --- | --- |"]
    lines += [f"| {path.name} | {what.get(path.name, 'a report of the attention study')} |"
              for path in [*files, Path("README.md")]]
    if left_out:
        lines += ["", "Left out of the tarball (too large): " + ", ".join(left_out)]
    return "\n".join(lines) + "\n"

"""The check as one command: the chosen parts run in order through the registry, each merged into
``<out>/gpu_check.json`` as it ends (earlier parts kept); a SIGTERM or SIGINT stops the running command, keeps what
finished and says how to go on."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from nmt.chain.runner import Interrupted, signals_interrupt
from nmt.common.entry_point import fail
from nmt.common.files import write_json_durably
from nmt_tools.gpu_check.machine import machine_info
from nmt_tools.gpu_check.options import parse_args
from nmt_tools.gpu_check.pack import pack
from nmt_tools.gpu_check.registry import PARTS, attempt, names


def main(argv: list[str] | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    """Run the chosen parts in order, merge them into ``<out>/gpu_check.json``; returns it.

    Raises:
        Interrupted: a SIGTERM or SIGINT stopped the running part (its command saved and exited first).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv, project_dir or Path.cwd())
    if args.require_cuda:
        import torch

        if not torch.cuda.is_available():
            fail("gpu_check.py", f"this check needs a CUDA device and PyTorch {torch.__version__} finds none here "
                                 "(--require-cuda, set by --device-run): run it on a GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    report["machine"] = machine_info(args.project_dir)
    report.setdefault("seconds", {})
    with signals_interrupt():
        for part in [p for p in names() if p in args.parts]:  # in the registry's order, whatever order was given
            started = time.perf_counter()
            try:
                report[part] = attempt(args, lambda part=part: PARTS[part].measure(args))
            except Interrupted as stopped:
                report[part] = {"stopped": f"{stopped}: its command saved and exited; run the same command to go on"}
                write_json_durably(path, report)
                print(f"gpu_check: {part}: {report[part]['stopped']} (the parts done are kept in {path})",
                      flush=True)
                raise
            report["seconds"][part] = time.perf_counter() - started
            write_json_durably(path, report)
            print(f"gpu_check: {part}: {json.dumps(report[part], default=str)[:400]}", flush=True)
    print(f"gpu_check: wrote {path}", flush=True)
    if args.pack is not None:
        files = pack(args, report, argv)
        print(f"gpu_check: packed {len(files)} files into {args.pack}: {', '.join(p.name for p in files)}", flush=True)
    return report

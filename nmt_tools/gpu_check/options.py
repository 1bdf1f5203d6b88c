"""The check's command line: which parts, their sizes, the budget, and the device profile (``device_run.json``:
the parts, budget and files of one device call, as data)."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from nmt.analysis.cli import OutputsParser
from nmt.chain.budget import Budget
from nmt_tools.gpu_check.registry import PARTS, names
from nmt_tools.gpu_check.runs import PACK_SECONDS

DESCRIPTION = ("The GPU path in one command: the CUDA tests, eager against graphs (training, the recipe, search), "
               "trainings side by side on one card, the attention study; each part resumable and written to "
               "<out>/gpu_check.json, within --budget-seconds if given (a part that does not fit is skipped, a "
               "command running at its end is stopped). A SIGTERM or Ctrl-C stops the running command (it saves "
               "first) and keeps what finished: the same command goes on.")
DEVICE_RUN = json.loads(resources.files("nmt_tools.gpu_check").joinpath("device_run.json").read_text())["options"]


def parts_help() -> str:
    """Each part and the first paragraph of its docstring, in the order they run in."""
    lines = ["parts (each skips a run whose results.json or report exists):"]
    for name in names():
        doc = (PARTS[name].measure.__doc__ or "").split("\n\n")[0]
        lines.append(f"  {name:<10} {' '.join(doc.split())}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None, project_dir: Path) -> argparse.Namespace:
    """The check's options; ``--device-run`` first sets the device profile (``device_run.json``), which options
    given on the command line override. Budget estimates and parts come from the registry."""
    parser = OutputsParser(prog="gpu_check.py", description=DESCRIPTION, folders=("out", "pack"),
                           epilog=parts_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and gpu_check.json")
    parser.add_argument("--parts", nargs="+", choices=names(), default=["graphs", "translate"])
    parser.add_argument("--device-run", action="store_true",
                        help="the device profile: " + ", ".join(f"{k}={v}" for k, v in DEVICE_RUN.items()))
    parser.add_argument("--require-cuda", action="store_true",
                        help="stop in one line, before any work, on a machine without a CUDA device")
    parser.add_argument("--budget-seconds", type=float, help="the whole check's time: parts that do not fit are "
                        "skipped, a command running at its end is stopped (default: none)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a part that fails is noted in the JSON and the next one runs")
    parser.add_argument("--pack", type=Path, metavar="DIR", help="at the end, at most --max-files files into DIR")
    parser.add_argument("--max-files", type=int, default=DEVICE_RUN["max_files"],
                        help="the files --pack may write (what one device call brings back)")
    parser.add_argument("--experiment", default="multi30k_best", help="train.py's experiment for every training")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps of each precision run")
    parser.add_argument("--graph-steps", type=int, default=600, help="optimizer steps of each graphs run")
    parser.add_argument("--graph-precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--recipe-paths", nargs="+", choices=("graphs", "eager", "auto"), default=["auto"],
                        help="the recipe once per path: trainer.cuda_graphs=true, false, or the default")
    parser.add_argument("--eager-max-steps", type=int, help="cap the eager recipe run at this many steps")
    parser.add_argument("--recipe-overrides", nargs="*", default=[],
                        help="train.py overrides for the recipe part alone, e.g. trainer.precision=fp32")
    parser.add_argument("--target-bleu", type=float, default=38.0, help="greedy val BLEU the recipe part times")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--search-batch-tokens", default="auto", help="the search part's --batch-tokens")
    parser.add_argument("--search-reps", type=int, default=3, help="timed translations per beam size (median)")
    parser.add_argument("--search-precisions", nargs="+", default=["auto"], choices=["auto", "bf16", "fp32"],
                        help="the search part's precisions, each eager against graphs (fp32: the tokens must agree)")
    parser.add_argument("--bt-checkpoint", help="the en→de model that back-translates the captions (default: one "
                        "trained here for --bt-model-steps)")
    parser.add_argument("--bt-model-steps", type=int, default=600, help="steps of the en→de model trained here")
    parser.add_argument("--bt-limit", type=int, default=1_000_000, help="back-translate the first N captions (all)")
    parser.add_argument("--parallel-counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--parallel-steps", type=int, default=300, help="optimizer steps of each parallel training")
    parser.add_argument("--mps", action="store_true", help="the parallel part again under CUDA MPS")
    parser.add_argument("--recipe", default="bt_best", help="reproduce.py's recipe for the chain part")
    parser.add_argument("--parallel", type=int, default=3, help="chain stages at once on the GPU")
    parser.add_argument("--study-budget", type=float, help="seconds for the study (default: what is left)")
    parser.add_argument("--study-parallel", default="auto", help="the study's parallel= setting")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="extra train.py overrides for every run (data.*, or model=small for a quick try)")
    parser.add_argument("--project-dir", type=Path, default=project_dir, help=argparse.SUPPRESS)
    if "--device-run" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**DEVICE_RUN)  # options given on the command line still win
    args = parser.parse_args(argv)
    steps = [args.steps, args.graph_steps, args.parallel_steps, args.bt_model_steps, args.eager_max_steps or 2]
    if min(steps) < 2:
        parser.error(f"--steps {args.steps} / --graph-steps {args.graph_steps} / --parallel-steps "
                     f"{args.parallel_steps} / --bt-model-steps {args.bt_model_steps} / --eager-max-steps "
                     f"{args.eager_max_steps}: give at least 2 optimizer steps")
    if min(args.parallel_counts) < 1:
        parser.error(f"--parallel-counts {args.parallel_counts}: give whole numbers >= 1")
    seconds = None if args.budget_seconds is None else args.budget_seconds - PACK_SECONDS  # packing comes after
    args.budget = Budget.seconds_from_now(seconds, f"the {args.budget_seconds or 0:.0f} s budget")
    return args

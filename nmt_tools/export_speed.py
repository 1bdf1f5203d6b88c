"""``scripts/export_speed.py``: an exported model on ``nmt_runtime`` against the PyTorch engine, on the CPU.

    python scripts/export_speed.py --run outputs/RUN                       # Multi30k test_2016_flickr (mirror)
    python scripts/export_speed.py --run outputs/RUN --source test.de --reference test.en --out runs/export_speed

The run is exported twice (fp32, and ``int8=true``) into ``OUT/exports``. Four systems are then measured,
each in a process of its own (``nmt_tools/export_speed_worker.py``, so that peak memory is its own and the
runtime's process never imports PyTorch): the engine at ``precision=fp32`` and ``int8`` (torch's dynamic int8
linear layers), and the runtime on the fp32 and the int8 folder. Per system and search (greedy, beam 5):
sentences/s over the whole source in token batches, one-sentence-at-a-time latency, BLEU and chrF, and the
lines identical to the engine fp32's; per system its peak memory; and the installed size of the packages
each system needs (the runtime: onnxruntime, numpy, SentencePiece; the engine: torch, numpy, SentencePiece,
with their dependencies). Writes ``OUT/export_speed.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from packaging.requirements import Requirement

from nmt.analysis.cli import write_report
from nmt.common.entry_point import check_options_or_exit
from nmt.common.files import write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.provenance import provenance
from nmt.data.text import read_lines
from nmt.export import ExportSettings, export_main
from nmt.inference.engine import Translator
from nmt_tools.cli import mirror_file, parser
from nmt_tools.export_speed_worker import BEAMS

SYSTEMS = (("engine", "fp32"), ("engine", "int8"), ("runtime", "fp32"), ("runtime", "int8"))


def export_folders(run: str, out: Path) -> dict[str, Path]:
    """The run exported as fp32 and int8 ONNX folders under ``out/exports`` (reused when already there)."""
    folders = {}
    for precision in ("fp32", "int8"):
        folder = out / "exports" / precision
        if not (folder / "export.json").is_file():
            export_main(OmegaConf.structured(ExportSettings(checkpoint=run, output=str(folder),
                                                            int8=precision == "int8")))
        folders[precision] = folder
    return folders


def run_worker(system: str, precision: str, model: str | Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One system measured in a fresh process; its JSON line."""
    command = [sys.executable, "-m", "nmt_tools.export_speed_worker", "--system", system, "--model", str(model),
               "--precision", precision, "--source", str(out / "source.txt"), "--threads", str(args.threads),
               "--latency-sentences", str(args.latency_sentences), "--out-dir", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)  # nmt_tools is importable: installed, or the cwd
    if done.returncode != 0:
        raise SystemExit(f"export_speed: the {system} {precision} worker failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def score(rows: list[dict[str, Any]], references: list[str], out: Path) -> None:
    """BLEU, chrF and the lines identical to the engine fp32's, into each row's searches."""
    for search in BEAMS:
        baseline = (out / f"engine_fp32.{search}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        for row in rows:
            outputs = (out / f"{row['system']}_{row['precision']}.{search}.txt").read_text(encoding="utf-8")
            outputs = outputs.split("\n")[:-1]
            scores = corpus_scores(outputs, references)
            row["searches"][search].update(
                bleu=scores["bleu"], chrf=scores["chrf"], bleu_signature=scores["bleu_signature"],
                identical_to_engine_fp32=sum(a == b for a, b in zip(outputs, baseline)), lines=len(outputs))


def installed_mib(roots: tuple[str, ...]) -> float:
    """MiB of the files of distributions ``roots`` and everything they require on this platform (no extras)."""
    seen: set[str] = set()
    todo, total = list(roots), 0
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a platform-only dependency not installed here
        total += sum(path.stat().st_size for f in dist.files or [] if (path := Path(f.locate())).is_file())
        requirements = [Requirement(line) for line in dist.requires or []]
        todo += [req.name for req in requirements if req.marker is None or req.marker.evaluate({"extra": ""})]
    return total / 2**20


def markdown(rows: list[dict[str, Any]], sizes: dict[str, float], lines: int) -> str:
    """The results as one table per search, then peak memory and installed sizes."""
    text = [f"# Exported model vs PyTorch engine ({lines} sentences, CPU)", ""]
    base = {s: next(r for r in rows if (r["system"], r["precision"]) == ("engine", "fp32"))["searches"][s]
            for s in BEAMS}
    for search in BEAMS:
        text += [f"## {search}", "", "| system | sentences/s | × engine fp32 | latency ms (p50) | BLEU | chrF | "
                 "identical lines | peak MiB |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            s = row["searches"][search]
            text.append(f"| {row['system']} {row['precision']} | {s['sentences_per_s']:.1f} | "
                        f"{s['sentences_per_s'] / base[search]['sentences_per_s']:.2f} | {s['latency_ms_p50']:.1f} | "
                        f"{s['bleu']:.2f} | {s['chrf']:.2f} | {s['identical_to_engine_fp32']}/{s['lines']} | "
                        f"{row['peak_rss_mib']:.0f} |")
        text.append("")
    text += [f"Installed size: runtime {sizes['runtime']:.0f} MiB, engine {sizes['engine']:.0f} MiB."]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    out = Path(args.out or Path(args.run) / "export_speed")
    check_options_or_exit("export_speed.py", folders={"--out": out})  # the default too, before any work
    out.mkdir(parents=True, exist_ok=True)
    info = Translator.from_checkpoint(args.run, device="cpu").info()
    source = read_lines(Path(args.source) if args.source else mirror_file(info["src_lang"]))[: args.limit]
    references = read_lines(Path(args.reference) if args.reference else mirror_file(info["tgt_lang"]))[: args.limit]
    write_text_durably(out / "source.txt", "".join(line + "\n" for line in source))
    folders = export_folders(args.run, out)
    rows = []
    for system, precision in SYSTEMS:
        model = args.run if system == "engine" else folders[precision]
        rows.append(run_worker(system, precision, model, args, out))
        print(f"{system} {precision}: " + ", ".join(f"{search} {row['sentences_per_s']:.1f} sentences/s"
                                                    for search, row in rows[-1]["searches"].items()), flush=True)
    score(rows, references, out)
    sizes = {"runtime": installed_mib(("onnxruntime", "numpy", "sentencepiece")),
             "engine": installed_mib(("torch", "numpy", "sentencepiece"))}
    report = {**provenance("scripts/export_speed.py", argv), "run": args.run, "threads": args.threads,
              "sentences": len(source), "results": rows, "installed_mib": sizes}
    write_report(out / "export_speed", report, markdown(rows, sizes, len(source)))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    arguments = parser(__doc__)
    arguments.add_argument("--run", required=True, help="a run dir (or .pt file) written by train.py")
    arguments.add_argument("--source", help="source sentences (plain or .gz); default: the mirror's test_2016_flickr")
    arguments.add_argument("--reference", help="their references; default: the mirror's test_2016_flickr")
    arguments.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    arguments.add_argument("--latency-sentences", type=int, default=100, help="sentences timed one at a time")
    arguments.add_argument("--threads", type=int, default=2, help="CPU threads of both systems")
    arguments.add_argument("--out", help="folder for the exports and the report; default: RUN/export_speed")
    return arguments.parse_args(argv)


if __name__ == "__main__":  # python -m nmt_tools.export_speed, from a plain install too
    main()

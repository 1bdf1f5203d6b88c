"""Speed on this machine, one mode per question: training, translation, data preparation, the server.

    python scripts/benchmark.py train model=default attention=additive --train-steps 30 --out runs/bench/train
    python scripts/benchmark.py train model=default --checkpoint outputs/RUN     # real BLEU too; JSON into RUN
    python scripts/benchmark.py translate --checkpoint outputs/RUN --beam-sizes 1 5 10 --reps 5
    python scripts/benchmark.py translate --checkpoint RUN_A RUN_B --beam-sizes 5 --out ens   # an ensemble
    python scripts/benchmark.py translate --checkpoint RUN --cuda-graphs true --batch-tokens auto \
        --save-translations runs/bench/graphs_hyps                                # a GPU's graph search
    python scripts/benchmark.py backtranslate --checkpoint outputs/EN_DE_RUN --limit 2000      # beam and sampling
    python scripts/benchmark.py data --out runs/bench/data                        # reads $NMT_DATA_MIRROR
    python scripts/benchmark.py scale --synthetic-pairs 500000 --ranks 1 2 --out runs/scale_500k
    python scripts/benchmark.py server --checkpoint outputs/RUN --clients 1 4 16
    python scripts/benchmark.py overload --checkpoint outputs/RUN --clients 300 --seconds 60
    python scripts/benchmark.py profile model=default attention=additive --out runs/bench/profile
    python scripts/benchmark.py study-speed RUN_NONE RUN_ADDITIVE ... --out runs/speed   # a grouped report's speeds

``train``: Hydra overrides of ``configs/train.yaml`` as ``train.py`` takes them; the project's own
``Trainer`` builds model, data and optimizer, and ``--train-steps`` of its real step are timed after
``--warmup-steps`` untimed ones (batch fetching included; CUDA synchronised per step): target tokens/s
(median of steps and total), with GPU utilisation from ``nmt.train.gpu_monitor``. Then the translation
figures below on the config's first test split, with ``--checkpoint`` or else with the model just
trained for a few steps (whose BLEU is meaningless: the JSON says so).
``translate``: ``Translator.translate`` on a whole file (default: ``$NMT_DATA_MIRROR``'s
test_2016_flickr) per beam size, the median of ``--reps`` after a warm-up, with BLEU/chrF when there is
a reference (``--save-translations DIR``: each beam size's last output as ``DIR/<mode>.txt``, to compare
two settings line by line); ``--cuda-graphs`` and ``--batch-tokens auto`` are handed to the engine as
``translate.py``'s ``cuda_graphs=`` and ``batch_tokens=``. ``backtranslate``: the back-translation job's
sentences/s with beam search and with sampling (``nmt_tools.backtranslation_speed``). ``data``:
preparation time (cold, then cached) and batch padding at the token budget (``nmt_tools.padding``).
``server``: ``serve.py`` under concurrent clients (``nmt_tools.load``).
``overload``: the worst request the server's limits let through, and up to 300 clients at once
(``nmt_tools.overload``).
``scale``: what a synthetic corpus of N pairs costs to prepare, load and start training on
(``nmt_tools.scale``). ``profile``: FLOPs per target token, achieved against peak FLOP/s, time per op group
(``nmt_tools.training_profile``). ``study-speed``: one trained run per group and direction, back to back in one
sitting: training tokens/s of its config and beam sentences/s of its checkpoint, the speed columns of
``compare_runs.py --group-by KEY --speed FILE...`` (``nmt_tools.study_speed``).

Writes ``<out>.json`` with the provenance block; ``<out>`` defaults to ``benchmark_<mode>_<device>`` in
the checkpoint's run dir; without a run dir, ``--out`` is required. A benchmark, not a test: it asserts
nothing. Details: docs/development/benchmarking.md.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from nmt.analysis.cli import one_line_errors, write_report
from nmt.common.device import INFERENCE_PRECISIONS, uses_bf16
from nmt.common.entry_point import check_options_or_exit, fail
from nmt.common.files import write_text_durably
from nmt.common.provenance import device_name, provenance
from nmt.common.settings import to_plain_dict
from nmt.inference.engine import SearchOptions, Translator
from nmt.inference.translate_job import read_input_lines
from nmt.model.seq2seq import count_parameters
from nmt.train.gpu_monitor import GpuMonitor
from nmt.train.trainer import DistInfo, Trainer
from nmt_tools import backtranslation_speed, load, overload, padding, scale, study_speed, training_profile
from nmt_tools.cli import add_project_dir, device_slug, mirror_file, parser
from nmt_tools.timing import compose_config, measure_training, measure_translation

CUDA_GRAPHS = ("auto", "true", "false")
MEANINGLESS_BLEU_NOTE = (
    "no --checkpoint: translated with the model trained for the benchmark's few steps; its BLEU is "
    "meaningless and its output lengths (hence speed) differ from a trained model's"
)


def parse_args(argv: list[str] | None, project_dir: Path | None = None) -> argparse.Namespace:
    p = parser(__doc__, folders=("save_translations",), reports=("out",))
    modes = p.add_subparsers(dest="mode", required=True,
                             metavar="{train,translate,backtranslate,data,scale,server,overload,profile,study-speed}")
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--out", type=Path, help="report path without extension (default: see above)")
    project = argparse.ArgumentParser(add_help=False)  # the modes that run train.py, serve.py or read configs/
    add_project_dir(project, project_dir)
    decode = argparse.ArgumentParser(add_help=False)
    decode.add_argument("--reps", type=int, default=3, help="timed translation runs per beam size (median)")
    decode.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    decode.add_argument("--batch-tokens", type=batch_tokens_value, default=4096,
                        help="translation batch budget: a number, or auto (the engine sizes it for the device)")
    train = modes.add_parser("train", parents=[out, decode, project], help="training tokens/s (+ translation)")
    train.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml, e.g. model=default")
    train.add_argument("--train-steps", type=int, default=100, help="timed optimizer steps")
    train.add_argument("--compile-step", action="store_true",
                       help="torch.compile the decoder's per-step body (compiled during the warm-up steps)")
    train.add_argument("--warmup-steps", type=int, default=10,
                       help="untimed optimizer steps first (not the learning-rate warmup)")
    train.add_argument("--checkpoint", help="run dir or .pt to translate with (default: the freshly trained model)")
    train.add_argument("--translate-limit", type=int, help="translate only the first N test lines")
    train.add_argument("--skip-translate", action="store_true", help="measure training only")
    translate = modes.add_parser("translate", parents=[out, decode], help="translation sentences/s")
    translate.add_argument("--checkpoint", required=True, nargs="+",
                           help="run dir or .pt file written by train.py; several: one ensemble")
    translate.add_argument("--input", help="source file (default: $NMT_DATA_MIRROR/multi30k/test_2016_flickr.<src>.gz)")
    translate.add_argument("--reference", help="reference for BLEU/chrF (default input: the mirror's)")
    translate.add_argument("--length-penalty", type=float, default=1.0)
    translate.add_argument("--device", default="auto", help="auto | cpu | cuda")
    translate.add_argument("--precision", default="auto", choices=INFERENCE_PRECISIONS,
                           help="as translate.py's precision")
    translate.add_argument("--limit", type=int, help="use only the first N sentences (smoke runs)")
    translate.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, help="as translate.py's cuda_graphs "
                           "(replayed decoder steps on a GPU); default: the engine's own")
    translate.add_argument("--save-translations", type=Path, metavar="DIR",
                           help="write each beam size's last translations to DIR/<mode>.txt")
    backtranslation_speed.add_arguments(modes.add_parser("backtranslate", parents=[out, project],
                                                         help="back-translation sentences/s, beam and sampling"))
    padding.add_arguments(modes.add_parser("data", parents=[out, project], help="data preparation time and padding"))
    scale.add_arguments(modes.add_parser("scale", parents=[out, project],
                                         help="what a corpus of N pairs costs: prepare, load, start training"))
    load.add_arguments(modes.add_parser("server", parents=[out, project], help="serve.py under concurrent clients"))
    overload.add_arguments(modes.add_parser("overload", parents=[out, project],
                                            help="serve.py: the worst request, and up to 300 clients at once"))
    training_profile.add_arguments(modes.add_parser("profile", parents=[out, project],
                                                    help="training FLOP/s and time per op group"))
    study_speed.add_arguments(modes.add_parser("study-speed", parents=[out, project],
                                               help="a grouped report's speeds: runs timed back to back"))
    return p.parse_args(argv)


def batch_tokens_value(text: str) -> int | str:
    """``--batch-tokens``: ``auto`` or a whole number >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a whole number >= 1")
    return value


def load_translator(checkpoint: str | list[str], args: argparse.Namespace) -> Translator:
    """The Translator of ``translate`` mode; ``--cuda-graphs``, when given, handed over as ``cuda_graphs=``.
    Exits with one line (status 2) when this engine takes no such setting."""
    engine = {} if args.cuda_graphs is None else {"cuda_graphs": args.cuda_graphs}
    try:
        return Translator.from_checkpoint(checkpoint, args.device, args.precision, max_input_words=None, **engine)
    except TypeError as error:
        if "cuda_graphs" not in str(error):
            raise
        fail("benchmark.py translate", f"--cuda-graphs {args.cuda_graphs}: this engine's Translator takes no "
             "cuda_graphs setting; leave the option out")


def save_translations(folder: Path, rows: list[dict[str, Any]]) -> None:
    """Each row's translations (popped from the row) as ``folder/<mode>.txt``, one line per sentence."""
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        write_text_durably(folder / f"{row['mode']}.txt", "".join(line + "\n" for line in row.pop("translations")))


def main(argv: list[str] | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    """Run the chosen mode, write its report; returns it. ``project_dir``: ``--project-dir``'s default."""
    with one_line_errors("benchmark.py"):
        args = parse_args(argv, project_dir)
        run_dir = report_folder(args)
        measure = {"train": benchmark_training, "translate": benchmark_translation,
                   "backtranslate": backtranslation_speed.benchmark_backtranslation,
                   "data": padding.benchmark_data, "scale": scale.benchmark_scale,
                   "server": load.benchmark_server, "overload": overload.benchmark_overload,
                   "profile": training_profile.benchmark_profile,
                   "study-speed": study_speed.benchmark_study_speed}[args.mode]
        report, device = measure(args)
        report = {"benchmark": args.mode, **provenance("scripts/benchmark.py", argv), **report}
        write_report(args.out or run_dir / f"benchmark_{args.mode}_{device_slug(device)}", report)
        return report


def report_folder(args: argparse.Namespace) -> Path | None:
    """The checkpoint's run dir, where the report goes without ``--out``, checked before any work; ``None`` with
    ``--out`` (the parser checked it). Exits with one line (status 2) when neither gives a place to write.
    """
    if args.out is not None:
        return None
    checkpoint = getattr(args, "checkpoint", None)
    if isinstance(checkpoint, list):  # translate modes: an ensemble's report has no one run dir to go to
        checkpoint = checkpoint[0] if len(checkpoint) == 1 else None
    if not (checkpoint and Path(checkpoint).is_dir()):
        fail(f"benchmark.py {args.mode}", "pass --out PATH (without extension): there is no run dir to write the "
             "report into")
    check_options_or_exit("benchmark.py", folders={"--out": checkpoint})  # the default: into the run dir
    return Path(checkpoint)


def benchmark_training(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``train`` mode: training figures, then translation on the first test split."""
    cfg = compose_config(args.overrides, args.project_dir)
    with tempfile.TemporaryDirectory(prefix="nmt_benchmark_") as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", DistInfo())  # its events (none) and checkpoints: scratch
        device = trainer.device
        if args.compile_step:
            trainer.model.decoder.compile_step()
        print(f"training {cfg.attention.name} ({count_parameters(trainer.model)} parameters) on {device_name(device)}: "
              f"{args.warmup_steps} warm-up + {args.train_steps} timed steps", flush=True)
        training = measure_training(trainer, args.train_steps, args.warmup_steps)
        print(f"training: {training['target_tokens_per_s_median']:.0f} target tokens/s (median of steps), "
              f"{training['target_tokens_per_s_total']:.0f} in total over {training['seconds']:.1f} s", flush=True)
        translation = None
        if not args.skip_translate:
            if args.checkpoint is None:
                trainer.save("last")  # the freshly trained model, as a checkpoint to load
            split = next(iter(trainer.data.tests.values()), trainer.data.valid)
            lines, refs = list(split.src_text[: args.translate_limit]), list(split.tgt_text[: args.translate_limit])
            with GpuMonitor.for_device(device) as gpu:  # model loading included
                translator = Translator.from_checkpoint(args.checkpoint or Path(tmp) / "run", device,
                                                        trainer.precision, max_input_words=None)
                rows = measure_translation(translator, lines, refs, args)
            translation = {"checkpoint": args.checkpoint, "bleu_meaningful": args.checkpoint is not None,
                           "note": None if args.checkpoint else MEANINGLESS_BLEU_NOTE, "split": split.name,
                           "sentences": len(lines), "batch_tokens": args.batch_tokens, "reps": args.reps,
                           "results": rows, "gpu_utilisation": gpu.summary()}
        trainer.logger.close()
    return {"device": {"type": device.type, "name": device_name(device)}, "measured_without_gpu": device.type != "cuda",
            "config": {"overrides": list(args.overrides), "compile_step": args.compile_step, **to_plain_dict(cfg)},
            "training": training,
            "translation": translation}, device


def benchmark_translation(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``translate`` mode: sentences/s (and BLEU) per beam size for one checkpoint or an ensemble."""
    checkpoint = args.checkpoint[0] if len(args.checkpoint) == 1 else args.checkpoint
    translator = load_translator(checkpoint, args)
    device, train_cfg = translator.device, translator.configs[0]
    data = train_cfg.get("data") or {}
    src_path = Path(args.input) if args.input else mirror_file(data.get("src_lang", "de"))
    ref_path = Path(args.reference) if args.reference else None
    if not args.input and not ref_path and mirror_file(data.get("tgt_lang", "en")).is_file():
        ref_path = mirror_file(data.get("tgt_lang", "en"))
    lines = read_input_lines(src_path)[: args.limit]
    refs = read_input_lines(ref_path)[: args.limit] if ref_path else None
    rows = measure_translation(translator, lines, refs, args, args.length_penalty, keep=bool(args.save_translations))
    if args.save_translations:
        save_translations(args.save_translations, rows)
    config = {"checkpoint": checkpoint if isinstance(checkpoint, str) else list(checkpoint),
              "input": str(src_path), "reference": ref_path and str(ref_path),
              "sentences": len(lines), "reps": args.reps, "batch_tokens": args.batch_tokens,
              "cuda_graphs": args.cuda_graphs, "max_len": SearchOptions.max_len,
              "max_len_ratio": SearchOptions.max_len_ratio,
              "length_penalty": args.length_penalty, "precision": args.precision,
              "bf16_autocast": uses_bf16(args.precision, device), "model": train_cfg.get("model"),
              "attention": train_cfg.get("attention"),
              "direction": f"{data.get('src_lang', '?')}-{data.get('tgt_lang', '?')}"}
    graphs = translator.graphs  # the graph search's figures: captures, replays, the canary's checks and their cost
    return {"device": {"type": device.type, "name": device_name(device)}, "config": config, "results": rows,
            "cuda_graphs": asdict(graphs.stats) if graphs is not None else None}, device


if __name__ == "__main__":  # python -m nmt_tools.benchmark, from a plain install too
    main()

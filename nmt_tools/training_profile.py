"""``benchmark.py profile``: where a training step's time goes, and how close it runs to the CPU's peak.

    python scripts/benchmark.py profile model=default attention=additive --steps 20 --out OUT

Four figures, all on the trainer's real step (forward, loss, backward, clip, AdamW) over real batches:

- **Matmul FLOPs per target token**, counted by ``torch.utils.flop_counter.FlopCounterMode`` over the
  same batches that were timed (forward and backward; 2 FLOPs per multiply-add; padded positions vary
  per batch, so one batch is not enough), with the share of the encoder and the decoder
  (PyTorch attributes backward ops to modules only roughly; the rest is "not attributed").
  Elementwise work is not counted: it is small in FLOPs and large in time.
- **Achieved FLOP/s**: those FLOPs over the timed steps' seconds (their total target tokens/s; the
  median step's is reported beside it).
- **The CPU's fp32 peak**: derived (cores x clock x SIMD lanes x 2 FMA units x 2) from /proc/cpuinfo,
  and measured with a large float32 matmul on all threads (what PyTorch's GEMM attains here).
- **Where the time goes**: ``torch.profiler`` self time per ATen op over ``--profile-steps`` steps,
  grouped into matmuls, elementwise, loss and softmax, optimizer, data movement and other; "outside
  ATen ops" is the wall time minus all ops' self time (Python, dispatch, the profiler's own cost).

Not done here: changing the step (``nmt.train.trainer``); GPU profiles (use ``torch.profiler`` with CUDA).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.common.device import cpu_info

# Op-name patterns, first match wins; self CPU time of each ATen op goes to one group.
OP_GROUPS: tuple[tuple[str, str], ...] = (
    ("matmul", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|_mkldnn|mkldnn_|addmv|mv|dot)\b"),
    ("loss and softmax", r"aten::(_?log_softmax|nll_loss|_softmax|softmax|cross_entropy)"),
    ("optimizer", r"aten::_fused_adam|aten::_foreach|Optimizer\.|aten::_amp_foreach|clip_grad|aten::norm|"
                  r"aten::linalg_vector_norm"),
    ("data movement", r"aten::(copy_|cat|stack|index_select|index|gather|scatter|embedding|contiguous|clone|"
                      r"to|_to_copy|empty|zeros|zero_|fill_|narrow|split|chunk|select|slice|view|as_strided|"
                      r"transpose|t|permute|reshape|unsqueeze|squeeze|expand|masked_fill|where)\b"),
    ("elementwise", r"aten::(sigmoid|tanh|mul|add|sub|div|rsub|neg|exp|log|sum|mean|clamp|pow|sqrt|threshold|"
                    r"dropout|bernoulli|native_dropout|lerp|addcmul|addcdiv|_?sigmoid_backward|_?tanh_backward)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``profile`` mode's options."""
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml, e.g. model=default")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps (median tokens/s)")
    parser.add_argument("--profile-steps", type=int, default=5, help="steps under torch.profiler")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    parser.add_argument("--matmul-size", type=int, default=4096, help="n of the n x n fp32 matmul for the peak")


def cpu_facts() -> dict[str, Any]:
    """Cores PyTorch uses, the nominal clock, the widest SIMD the flags show, and the derived fp32 peak.

    The derivation assumes two FMA units per core (Xeon Gold/Platinum and most recent server cores);
    the measured matmul says what is reachable in practice.
    """
    info = cpu_info()
    flags = set(info.get("flags", "").split())
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    threads = torch.get_num_threads()
    ghz = float(info["cpu MHz"]) / 1000 if "cpu MHz" in info else None
    model = info.get("model name", "?")
    peak = threads * ghz * lanes * 2 * 2 * 1e9 if ghz else None  # lanes x 2 FMA units x 2 FLOPs per FMA
    return {"model": model, "threads": threads, "logical_cpus": os.cpu_count(), "clock_ghz": ghz,
            "fp32_lanes": lanes, "fma_units_assumed": 2, "fp32_peak_flops_derived": peak}


def measured_matmul_flops(n: int, reps: int = 5) -> float:
    """FLOP/s of an ``n x n`` float32 matmul on all threads (the best of ``reps`` after a warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def count_flops(trainer: Any, batches: Any, steps: int) -> tuple[int, dict[str, int], int]:
    """Matmul FLOPs of ``steps`` real training steps, per top-level module, and their target tokens."""
    counter = FlopCounterMode(display=False)
    tokens = 0
    with counter:
        for _ in range(steps):
            tokens += trainer.train_step(next(batches)).tokens
    total = counter.get_total_flops()
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()
                 if name.count(".") == 1}  # Seq2Seq.encoder, Seq2Seq.decoder; deeper names are inside them
    by_module["not attributed to a part"] = total - sum(by_module.values())
    return total, by_module, tokens


def op_time_groups(trainer: Any, batches: Any, steps: int) -> dict[str, Any]:
    """Self CPU time per op group (seconds and share of wall time) over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(next(batches))
        wall = time.perf_counter() - start
    groups: dict[str, float] = defaultdict(float)
    top = []
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        group = next((name for name, pattern in OP_GROUPS if re.match(pattern, event.key)), "other ops")
        groups[group] += seconds
        top.append((seconds, event.key, group))
    groups["outside ATen ops (Python, dispatch, profiler)"] = max(0.0, wall - sum(groups.values()))
    top.sort(reverse=True)
    return {"wall_seconds": wall, "steps": steps,
            "groups": {k: {"seconds": v, "share": v / wall} for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_ops": [{"op": key, "group": group, "seconds": s, "share": s / wall} for s, key, group in top[:15]]}


def benchmark_profile(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``profile`` mode: FLOPs, achieved and peak FLOP/s, time per op group; prints a summary."""
    import tempfile

    from nmt.train.trainer import DistInfo, Trainer
    from nmt_tools.timing import compose_config, endless_batches, measure_training

    cfg = compose_config(args.overrides, args.project_dir)
    with tempfile.TemporaryDirectory(prefix="nmt_profile_") as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", DistInfo())
        timing = measure_training(trainer, args.steps, args.warmup_steps)  # as benchmark.py train times steps
        batches = endless_batches(trainer)
        for _ in range(args.warmup_steps):
            next(batches)  # count FLOPs over the very batches that were timed: padding varies per batch
        flops, by_module, tokens = count_flops(trainer, batches, args.steps)
        ops = op_time_groups(trainer, batches, args.profile_steps)
        trainer.logger.close()
    facts = cpu_facts()
    flops_per_token = flops / tokens
    achieved = flops_per_token * timing["target_tokens_per_s_total"]  # = the timed steps' FLOPs / their seconds
    matmul_peak = measured_matmul_flops(args.matmul_size)
    report = {"config": {"overrides": list(args.overrides)}, "cpu": facts,
              "matmul_flops_per_target_token": flops_per_token, "flop_counted_target_tokens": tokens,
              "multiply_adds_per_target_token": flops_per_token / 2,
              "flops_share_by_module": {k: v / flops for k, v in by_module.items()}, "timing": timing,
              "achieved_flops": achieved,
              "achieved_flops_median_step": flops_per_token * timing["target_tokens_per_s_median"],
              "measured_matmul_flops": matmul_peak, "matmul_size": args.matmul_size,
              "achieved_share_of_derived_peak": achieved / facts["fp32_peak_flops_derived"]
              if facts["fp32_peak_flops_derived"] else None,
              "achieved_share_of_measured_matmul": achieved / matmul_peak, "time_by_op_group": ops}
    print(f"{flops_per_token / 1e6:.1f} MFLOP per target token (matmuls, forward + backward); "
          f"{timing['target_tokens_per_s_total']:.0f} target tokens/s -> {achieved / 1e9:.1f} GFLOP/s; "
          f"peak: derived {(facts['fp32_peak_flops_derived'] or 0) / 1e9:.0f}, "
          f"measured {args.matmul_size}^2 matmul {matmul_peak / 1e9:.0f} GFLOP/s")
    for group, entry in ops["groups"].items():
        print(f"  {group:<48} {100 * entry['share']:5.1f}%")
    return report, trainer.device

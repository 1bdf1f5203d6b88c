"""Train an attention-based GRU translation model: ``python train.py attention=additive``.

Thin entry point: Hydra composes ``configs/train.yaml`` with the command-line overrides, and
``nmt.training.train`` does the work (see README.md for the commands).
"""

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.config import ConfigError, check_command_line_keys
from nmt.training import train


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        results = train(cfg)
    except ConfigError as error:
        logging.getLogger("train").error("config error: %s", error)
        raise SystemExit(2) from None
    if results.get("interrupted"):
        # Exit the process, not just this job: under `-m` Hydra would otherwise start the next run.
        raise SystemExit(0)
    # A sweep's optimizers read the returned value: validation BLEU of the best checkpoint.
    return results.get("valid", {}).get("bleu")


if __name__ == "__main__":
    # Hydra would refuse an unknown key too, but without naming the key that was meant
    problem = check_command_line_keys(Path(__file__).parent / "configs", sys.argv[1:])
    if problem:
        print(f"train.py: error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()

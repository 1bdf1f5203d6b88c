"""Train an attention-based GRU translation model: ``python train.py attention=additive``.

Thin entry point: Hydra composes ``configs/train.yaml`` with the command-line overrides, and
``nmt.training.train`` does the work (see README.md for the commands). A mistake the user can fix
(config, data, checkpoint, device) ends in one line on stderr and exit status 2, not a traceback.
"""

import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from nmt.checkpoint import CheckpointError
from nmt.config import check_command_line_keys, resume_overrides
from nmt.training import USER_ERRORS, train


def fail(error: Exception | str) -> NoReturn:
    """Print ``error`` as one line on stderr and exit with status 2."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"train.py: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        results = train(cfg)
    except USER_ERRORS as error:
        fail(error)
    if results.get("interrupted"):
        # Exit the process, not just this job: under `-m` Hydra would otherwise start the next run.
        raise SystemExit(0)
    # A sweep's optimizers read the returned value: validation BLEU of the best checkpoint.
    return results.get("valid", {}).get("bleu")


if __name__ == "__main__":
    # Hydra would refuse an unknown key too, but without naming the key that was meant
    problem = check_command_line_keys(Path(__file__).parent / "configs", sys.argv[1:])
    if problem:
        fail(problem)
    try:  # a resumed run writes into its own run dir, not a new outputs/<date>/<time>/
        sys.argv += resume_overrides(sys.argv[1:])
    except CheckpointError as error:
        fail(error)
    main()

"""Train an attention-based GRU translation model: ``python train.py attention=additive``.

Thin entry point: Hydra composes ``configs/train.yaml`` with the command-line overrides, and
``nmt.train.trainer.train`` does the work (see README.md for the commands). A mistake the user can fix
(config, data, checkpoint, device, a run dir that cannot be made) ends in one line on stderr and exit status 2,
not a traceback, and takes away the run dir it made. A disk that fills mid-run ends in one line with exit status
74: the last good checkpoints are kept, and ``trainer.resume=RUN_DIR`` goes on.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.common.entry_point import (
    check_config_folders_or_exit,
    check_keys_or_exit,
    check_outputs_or_exit,
    check_run_dir_or_exit,
    disk_full_exits,
    exit_with_help_if_asked,
    hydra_saves_exit_when_full,
    refused_run_leaves_no_folder,
    same_command,
    user_errors,
)
from nmt.common.hydra_plugins import check_maximizing_sweep, with_sweeper_direction
from nmt.model.checkpoint import CheckpointError
from nmt.train.resume import resume_overrides
from nmt.train.schema import TrainSettings
from nmt.train.trainer import USER_ERRORS, train

NOTHING_KEPT = "no checkpoint was written yet"  # what a stop outside the trainer's checkpoint writes leaves
RUN_DIR_BEFORE_THE_RUN = (".hydra", "train.log", ".lock")  # what a run dir holds before training writes in it


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    with (refused_run_leaves_no_folder(RUN_DIR_BEFORE_THE_RUN), user_errors("train.py", USER_ERRORS),
          disk_full_exits("train.py", NOTHING_KEPT, same_command("train.py"))):
        check_maximizing_sweep()
        results = train(cfg)
    if results.get("interrupted"):
        # Exit the process, not just this job: under `-m` Hydra would otherwise start the next run.
        raise SystemExit(0)
    # A sweep's optimizers read the returned value: validation BLEU of the best checkpoint.
    return results.get("valid", {}).get("bleu")


if __name__ == "__main__":
    configs = Path(__file__).parent / "configs"
    exit_with_help_if_asked("train.py", configs, "train", sys.argv[1:], __doc__)
    check_keys_or_exit("train.py", configs, "train", sys.argv[1:], TrainSettings)
    sys.argv[1:] = with_sweeper_direction(sys.argv[1:])  # hydra/sweeper=optuna: maximize the BLEU main() returns
    check_outputs_or_exit("train.py", sys.argv[1:], folders=("data.cache_dir",))
    with user_errors("train.py", (CheckpointError,)):  # a resumed run writes into its own run dir only
        sys.argv += resume_overrides(sys.argv[1:])
    check_run_dir_or_exit("train.py", configs, "train", sys.argv[1:])  # the default too
    check_config_folders_or_exit("train.py", configs, "train", sys.argv[1:], ("data.cache_dir",))  # the default too
    hydra_saves_exit_when_full("train.py", NOTHING_KEPT, same_command("train.py"))  # .hydra/ on a full disk
    main()

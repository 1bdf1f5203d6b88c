"""The GPU path measured part by part (``scripts/gpu_check.py``): parts found through a registry, run through the
chain's runner (stopped by the budget or a signal, never left running), and packed for one device call."""

from nmt_tools.gpu_check import chain_parts, parallel_part, search_parts, training_parts  # noqa: F401  # register
from nmt_tools.gpu_check.chain_parts import STUDY_STOP_SECONDS
from nmt_tools.gpu_check.check import main
from nmt_tools.gpu_check.machine import git_commit, machine_info
from nmt_tools.gpu_check.options import DEVICE_RUN, parse_args
from nmt_tools.gpu_check.registry import PARTS
from nmt_tools.gpu_check.runs import PACK_SECONDS, SECONDS

__all__ = ["DEVICE_RUN", "PACK_SECONDS", "PARTS", "SECONDS", "STUDY_STOP_SECONDS", "git_commit", "machine_info",
           "main", "parse_args"]

"""The chain behind the best models and the attention study: a recipe's stages run as resumable subprocesses
within a budget, sharing one GPU, stopped cleanly by a budget or a signal, and summed up in one report."""

from nmt.chain.card import CardError
from nmt.chain.command import main
from nmt.chain.runner import Interrupted
from nmt.chain.settings import ChainError

__all__ = ["CardError", "ChainError", "Interrupted", "main"]

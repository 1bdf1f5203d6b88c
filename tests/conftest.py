"""Shared test fixtures: the corpus mirror, tiny sizes, and CPU determinism."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"


def _mirror_dir() -> Path | None:
    mirror = os.environ.get("NMT_DATA_MIRROR")
    if mirror and (Path(mirror) / "multi30k").is_dir():
        return Path(mirror)
    return None


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The corpus mirror (``NMT_DATA_MIRROR``, CI sets it to ../shared/corpora); skip without it."""
    mirror = _mirror_dir()
    if mirror is None:
        pytest.skip("NMT_DATA_MIRROR is not set to a folder holding multi30k/")
    return mirror


# pytest-xdist's workers (-n, pyproject.toml's addopts) share the cores: each gets its part of them, and so do the
# processes its tests start (OMP_NUM_THREADS), since two processes spinning two threads each on two cores slow
# each other many times over.
THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(THREADS)


# --- nmt.data fixtures: tiny synthetic parallel text and a tokenizer trained on it once ---------


def make_tiny_parallel(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` synthetic sentence pairs: 400 made-up words a side (umlauts on the source side),
    1-14 words a sentence, target length within 2 words of the source."""
    import random

    rng = random.Random(seed)

    def lexicon(syllables: list[str]) -> list[str]:
        return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(400)]

    src_words = lexicon(["ka", "lö", "mi", "sü", "te", "ra", "no", "vi", "ßa", "ber", "gen", "sch", "ei"])
    tgt_words = lexicon(["the", "bo", "qu", "ze", "fa", "wy", "gl", "pe", "ing", "ly", "str", "ou"])
    src, tgt = [], []
    for _ in range(n):
        length = rng.randint(1, 14)
        src.append(" ".join(rng.choice(src_words) for _ in range(length)) + rng.choice([".", "!", ""]))
        tgt_len = max(1, length + rng.randint(-2, 2))
        tgt.append(" ".join(rng.choice(tgt_words) for _ in range(tgt_len)).capitalize() + ".")
    return src, tgt


@pytest.fixture(scope="session")
def tiny_parallel() -> tuple[list[str], list[str]]:
    """1500 synthetic training pairs (source, target)."""
    return make_tiny_parallel(1500, seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_parallel: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory):
    """A joint unigram tokenizer (vocab <= 500) trained once per session on ``tiny_parallel``."""
    from nmt.data import train_tokenizer

    settings = tokenizer_settings(model_type="unigram", vocab_size=500, joint=True)
    return train_tokenizer(*tiny_parallel, settings, tmp_path_factory.mktemp("spm"))


def tokenizer_settings(**overrides: object):
    """``data.tokenizer`` of configs/data/multi30k.yaml (where its defaults live), with ``overrides`` on top."""
    from nmt.data import TokenizerSettings

    return TokenizerSettings(**{**data_config()["tokenizer"], **overrides})


def data_config(name: str = "multi30k", **overrides: object) -> dict:
    """``configs/data/<name>.yaml`` as plain values (a complete data section), with ``overrides`` on top."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml"), resolve=True)
    return {**cfg, **overrides}


@pytest.fixture(scope="session")
def multi30k_data(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Multi30k de-en prepared once per session from the mirror with the real configs/data/multi30k.yaml.

    Its 8k joint unigram model trains faster (~2 s) than a 1k one (unigram pruning runs longer).
    """
    from omegaconf import OmegaConf

    from nmt.data import prepare_data

    cfg = OmegaConf.load(CONFIG_DIR / "data" / "multi30k.yaml")
    cfg.mirror = str(mirror_dir)
    return prepare_data(cfg, cache_dir=tmp_path_factory.mktemp("multi30k_cache"))


# --- tiny trained-format checkpoints: translate.py, the Translator engine and the server ------------

SRC = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball.",
    "Eine Frau liest ein Buch im Park.",
    "Ein kleines Mädchen isst einen Apfel.",
    "Die Kinder spielen am Strand.",
]
TGT = [
    "A dog runs across the meadow.",
    "Two men play football.",
    "A woman reads a book in the park.",
    "A little girl eats an apple.",
    "The children play on the beach.",
]
TINY_MAX_WORDS = 9  # the tiny checkpoints' data.clean.max_len: translate.py cuts longer input lines to this


def save_tiny_checkpoint(path: Path, attention: str, seed: int = 0, vocab_size: int = 60,
                         src_lang: str = "de", tgt_lang: str = "en") -> Path:
    """A checkpoint of a tiny untrained model (odd sizes) with a SentencePiece model trained on SRC/TGT.

    Its weights are scaled up so that outputs differ between sentences; ``seed`` gives another model
    with the same tokenizer, ``vocab_size`` another tokenizer.
    """
    from nmt.data import train_tokenizer
    from nmt.model.checkpoint import save_checkpoint
    from nmt.model.seq2seq import Seq2Seq

    tokenizer = train_tokenizer(SRC * 3, TGT * 3, tokenizer_settings(vocab_size=vocab_size), cache_dir=None)
    config = {
        "model": {"emb_size": 8, "enc_hidden_size": 5, "dec_hidden_size": 7, "enc_layers": 1, "dec_layers": 1,
                  "dropout": 0.0, "tie_embeddings": True, "output_hidden_size": None, "layer_norm": False},
        "attention": {"name": attention, "hidden_size": None, "dropout": 0.0},
        "data": {"src_lang": src_lang, "tgt_lang": tgt_lang, "clean": {"max_len": TINY_MAX_WORDS, "max_ratio": 3.0}},
    }
    torch.manual_seed(seed)
    model = Seq2Seq.from_config(config["model"], config["attention"], tokenizer.src_vocab_size,
                                tokenizer.tgt_vocab_size)
    with torch.no_grad():  # peakier than the init, so outputs differ between sentences
        for p in model.parameters():
            p.mul_(3.0)
    return save_checkpoint(path, {"config": config, "tokenizer": tokenizer.to_state(), "model": model.state_dict()})


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir holding checkpoints/best.pt of a tiny additive-attention model (``save_tiny_checkpoint``)."""
    root = tmp_path_factory.mktemp("tiny_run")
    save_tiny_checkpoint(root / "checkpoints" / "best.pt", "additive")
    return root


# --- nmt.serve: a real server on a background thread ---------------------------------------------


@contextlib.contextmanager
def serve_in_thread(app: object) -> Iterator[str]:
    """Run ``app`` (``create_app``) with uvicorn on a background thread, on a free port of 127.0.0.1; yields its
    base URL."""
    import uvicorn

    from nmt.serve.server import bind_socket, uvicorn_config

    sock = bind_socket("127.0.0.1", 0)  # 0: the system chooses the port
    server = uvicorn.Server(uvicorn_config(app))
    for name in ("uvicorn.error", "uvicorn.access"):  # quieter than the settings' log_level
        logging.getLogger(name).setLevel(logging.WARNING)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start; see its log above")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# --- a real one-node SLURM cluster (scripts/slurm_cluster.sh) for the cluster tier: pytest -m cluster -----------------


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: ``conf`` is its slurm.conf, which sbatch, squeue, scancel and sacct find in ``SLURM_CONF``."""

    root: Path
    conf: Path

    @property
    def accounting(self) -> bool:
        """Whether the cluster keeps accounting (slurmdbd), so that ``sacct`` answers; without it sacct fails."""
        return (self.root / "slurmdbd.conf").is_file()

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` set: what a command that submits to the cluster needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private one-node SLURM cluster for the session (``scripts/slurm_cluster.sh start``; stopped after), with
    accounting when slurmdbd and MariaDB are installed. Skips without SLURM (Debian's slurm-wlm and munge) or root,
    unless ``NMT_REQUIRE_SLURM=1`` (set by ``.ci/run``, which installs them), where it fails, as it does then without
    accounting."""
    required = os.environ.get("NMT_REQUIRE_SLURM") == "1"
    missing = [name for name in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(name) is None]
    reason = (f"needs {', '.join(missing)}: apt-get install slurm-wlm munge slurmdbd mariadb-server" if missing
              else "needs root (the private cluster runs as SlurmUser=root)" if os.geteuid() != 0 else None)
    if reason:
        if required:
            pytest.fail(f"NMT_REQUIRE_SLURM=1 but the SLURM tier {reason}")
        pytest.skip(reason)
    script, root = REPO_ROOT / "scripts" / "slurm_cluster.sh", tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(script), "start", str(root)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SLURM_CLUSTER_ACCOUNTING": "yes" if required else "auto"})
    try:
        if proc.returncode != 0:
            pytest.fail(f"scripts/slurm_cluster.sh start {root} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        yield SlurmCluster(root, root / "slurm.conf")
    finally:
        subprocess.run(["bash", str(script), "stop", str(root)], capture_output=True, text=True, timeout=300)

"""Corpora: the registry that maps a split name and a language direction to two local files, aligned by line
(``multi30k``, Elliott et al., 2016; the user's ``files``; others register themselves the same way).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from nmt.data.errors import DataError
from nmt.data.fetch import fetch_file, mirror_folder


class Corpus(abc.ABC):
    """A source of parallel splits. Subclasses register under ``name`` and say which files a split is.

    Construct with ``build_corpus``; ``split_files`` is the only thing the pipeline asks of one.
    """

    name: ClassVar[str]

    @classmethod
    def from_settings(cls, cache_dir: Path, mirror: Path | None, data_cfg: Mapping[str, Any]) -> Corpus:
        """The corpus for the ``data`` settings (a subclass reads the keys it has, e.g. ``data.files``)."""
        return cls(cache_dir, mirror)  # type: ignore[call-arg]

    @abc.abstractmethod
    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        """Local (fetched, verified) source and target files of ``split``.

        Raises:
            DataError: unknown split or language, or the files cannot be had.
        """


CORPORA: dict[str, type[Corpus]] = {}


def register_corpus(cls: type[Corpus]) -> type[Corpus]:
    """Class decorator: make a corpus selectable as ``data.corpus=<cls.name>``."""
    CORPORA[cls.name] = cls
    return cls


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"

# Languages of each Multi30k task 1 split (the 2017 test sets have no Czech).
MULTI30K_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}

# sha256 of the official files: every file of every split above.
MULTI30K_SHA256: dict[str, str] = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


@register_corpus
class Multi30k(Corpus):
    """Multi30k task 1: ~29k English image captions with German, French and Czech translations.

    Args:
        cache_dir: the data cache; files go to ``cache_dir/multi30k/``.
        mirror: a folder holding ``multi30k/<file>`` or ``<file>``, tried before the network.
    """

    name = "multi30k"
    sha256 = MULTI30K_SHA256

    def __init__(self, cache_dir: Path, mirror: Path | None = None) -> None:
        self.dir = Path(cache_dir) / self.name
        self.mirror = mirror

    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        if split not in MULTI30K_SPLITS:
            raise DataError(f"multi30k has no split {split!r}; valid splits: {', '.join(MULTI30K_SPLITS)}.")
        langs = MULTI30K_SPLITS[split]
        for lang in (src_lang, tgt_lang):
            if lang not in langs:
                raise DataError(f"multi30k split {split!r} has no language {lang!r}; it has {', '.join(langs)}. Set "
                                f"data.src_lang / data.tgt_lang to two of them, or drop {split!r} from the splits.")
        return self.fetch(f"{split}.{src_lang}.gz"), self.fetch(f"{split}.{tgt_lang}.gz")

    def fetch(self, name: str) -> Path:
        """Fetch (or find in the cache) one file of ``MULTI30K_SPLITS`` by name, verifying its hash."""
        return fetch_file(name, MULTI30K_URL.format(name=name), self.dir, sha256=self.sha256[name], corpus=self.name,
                          mirror=self.mirror)


@register_corpus
class ParallelFiles(Corpus):
    """The user's own parallel text: ``{split: {"src": path, "tgt": path}}``, plain or ``.gz``.

    Relative paths resolve against the current working directory. Languages are labels only.
    """

    name = "files"

    @classmethod
    def from_settings(cls, cache_dir: Path, mirror: Path | None, data_cfg: Mapping[str, Any]) -> ParallelFiles:
        return cls(data_cfg.get("files"))

    def __init__(self, files: Mapping[str, Mapping[str, Any]] | None) -> None:
        if not files:
            raise DataError("data.corpus=files needs data.files: a mapping {split: {src: path, tgt: path}} for the "
                            "train, validation and test splits (see configs/data/files.yaml).")
        self.files = {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in files.items()}

    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        entry = self.files.get(split)
        if not isinstance(entry, dict):
            raise DataError(f"data.files has no entry for split {split!r} (it has: {', '.join(self.files) or 'none'}). "
                            f"Add data.files.{split}.src=<path> and data.files.{split}.tgt=<path>.")
        paths = []
        for side in ("src", "tgt"):
            value = entry.get(side)
            if not value:
                raise DataError(f"data.files.{split} has no {side!r} path; set data.files.{split}.{side}=<path>.")
            path = Path(str(value)).expanduser()
            if not path.is_file():
                raise DataError(f"data.files.{split}.{side} = {path} does not exist (resolved to {path.absolute()}). "
                                "Relative paths resolve against the working directory; give an absolute path.")
            paths.append(path)
        return paths[0], paths[1]


def build_corpus(name: str, *, cache_dir: Path, mirror: str | Path | None = None,
                 files: Mapping[str, Mapping[str, Any]] | None = None,
                 settings: Mapping[str, Any] | None = None) -> Corpus:
    """The registered corpus ``name`` (a key of ``CORPORA``), constructed from the data settings.

    Args:
        mirror: a folder tried before the network.
        files: ``data.files`` (for ``files``).
        settings: the whole ``data`` section, for corpora with settings of their own (``data.tatoeba``).

    Raises:
        DataError: unknown corpus (the message lists the valid ones), or a bad ``files`` mapping.
    """
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}; valid corpora: {', '.join(sorted(CORPORA))}.")
    return CORPORA[name].from_settings(Path(cache_dir), mirror_folder(mirror), {**(settings or {}), "files": files})


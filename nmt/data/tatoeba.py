"""The Tatoeba German–English corpus (``data=tatoeba``): train and dev from a sha256-pinned manythings.org export,
test the Tatoeba Translation Challenge set v2021-08-07 (Tiedemann, 2020), training pairs seen in test dropped.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import random
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nmt.common.files import write_bytes_durably
from nmt.data.corpora import Corpus, register_corpus
from nmt.data.errors import DataError
from nmt.data.fetch import fetch_file, sha256_of
from nmt.data.text import iter_decoded, read_lines

log = logging.getLogger(__name__)
DERIVE_VERSION = 1  # bumped when the derived splits change for the same inputs

ZIP_NAME = "deu-eng.zip"
ZIP_MEMBER = "deu.txt"
ZIP_URL = "https://raw.githubusercontent.com/rioyshky/translation/de48b7027f7318d77010a6e08ed928c10748c23d/deu-eng.zip"
ZIP_SHA256 = "b7688f84f99fa33c17397c14d8bd9cef1fdeb2ee0bf50074767023aee8926e28"  # the 2018-05-13 export
TEST_URL = "https://raw.githubusercontent.com/Helsinki-NLP/OPUS-MT-testsets/ac0f19c/testsets/deu-eng/{name}"
TEST_SHA256 = {
    "tatoeba-test-v2021-08-07.deu": "a06d3300c05158e83bb5c1709a0bf5aecc2e28c895e66f03b1c914a7fdd8c8c6",
    "tatoeba-test-v2021-08-07.eng": "5d0e3169914a5e3f4ca7bdec670880f2025385c5a7e29547d9cbd7992105e77f",
}
LANG_CODES = {"de": "deu", "en": "eng"}
SPLITS = ("train", "dev", "test")


@dataclass
class TatoebaSettings:
    """``data.tatoeba``: how the splits are made. This dataclass is the one home of their defaults.

    Attributes:
        dev_size: pairs in the dev split (at least; whole English sentences are moved).
        dev_seed: the seed of the dev cut.
        zip: a local export to read instead of the pinned one (null: the pinned export, from the mirror's
            ``tatoeba/`` folder or its public origin).
        sha256: the export's expected sha256; another export's hash accepts that export.
    """

    dev_size: int = 2000
    dev_seed: int = 1
    zip: str | None = None
    sha256: str = ZIP_SHA256


@register_corpus
class Tatoeba(Corpus):
    """Tatoeba German–English: ``train`` and ``dev`` from the pinned export, ``test`` the Challenge set; files go to
    ``cache_dir/tatoeba/``, ``mirror`` (holding ``tatoeba/<file>`` or ``<file>``) is tried before the network.
    """

    name = "tatoeba"

    def __init__(self, cache_dir: Path, mirror: Path | None = None, settings: TatoebaSettings | None = None) -> None:
        self.dir = Path(cache_dir) / self.name
        self.mirror = mirror
        self.settings = settings or TatoebaSettings()

    @classmethod
    def from_settings(cls, cache_dir: Path, mirror: Path | None, data_cfg: Mapping[str, Any]) -> Tatoeba:
        return cls(cache_dir, mirror, TatoebaSettings(**(data_cfg.get("tatoeba") or {})))

    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        if split not in SPLITS:
            raise DataError(f"tatoeba has no split {split!r}; valid splits: {', '.join(SPLITS)}.")
        for lang in (src_lang, tgt_lang):
            if lang not in LANG_CODES:
                raise DataError(f"tatoeba (deu-eng) has no language {lang!r}; set data.src_lang and data.tgt_lang "
                                "to de and en (either way round).")
        return self.derived / f"{split}.{src_lang}", self.derived / f"{split}.{tgt_lang}"

    def info(self) -> dict[str, Any]:
        """What the splits were made from and what was dropped (``stats.json``), for results.json."""
        return json.loads((self.derived / "stats.json").read_text())

    @functools.cached_property
    def derived(self) -> Path:
        """The folder of the derived splits, made on first use (cached by the inputs' hashes and settings)."""
        export = self._export()
        tests = {lang: self._fetch_test(f"tatoeba-test-v2021-08-07.{code}") for lang, code in LANG_CODES.items()}
        identity = {"version": DERIVE_VERSION, "export": self.settings.sha256,
                    "test": [TEST_SHA256[p.name] for p in tests.values()],
                    "dev_size": self.settings.dev_size, "dev_seed": self.settings.dev_seed}
        folder = self.dir / hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        if not (folder / "stats.json").is_file():
            stats = write_splits(export, tests, folder, self.settings)
            write_bytes_durably(folder / "stats.json", json.dumps({**identity, **stats}, indent=1).encode())
            log.info("tatoeba: %s", stats)
        return folder

    def _export(self) -> Path:
        if self.settings.zip is None:
            try:
                return fetch_file(ZIP_NAME, ZIP_URL, self.dir, sha256=self.settings.sha256, corpus=self.name,
                                  mirror=self.mirror)
            except DataError as error:
                raise DataError(f"{error} To train on another Tatoeba export anyway: data.tatoeba.zip=<its path> "
                                "data.tatoeba.sha256=<its hash>, or extract its pairs and use data=files.") from None
        path = Path(self.settings.zip).expanduser()
        if not path.is_file():
            raise DataError(f"data.tatoeba.zip = {path} does not exist; give the path of a deu-eng.zip export.")
        if (actual := sha256_of(path)) != self.settings.sha256:
            raise DataError(
                f"{path} has sha256 {actual}, not the expected {self.settings.sha256} (the pinned 2018-05-13 "
                f"export): a different Tatoeba export. To train on it anyway, add data.tatoeba.sha256={actual} "
                "(the first two columns, English<TAB>German, are read), or extract its pairs and use data=files.")
        return path

    def _fetch_test(self, name: str) -> Path:
        return fetch_file(name, TEST_URL.format(name=name), self.dir, sha256=TEST_SHA256[name], corpus=self.name,
                          mirror=self.mirror)


def read_export(path: Path) -> Iterator[tuple[str, str]]:
    """The ``(english, german)`` pairs of a ``deu-eng.zip`` export, streamed from the zip.

    Raises:
        DataError: not a zip, a truncated or corrupt one, no ``deu.txt`` inside, invalid UTF-8, or a
            line without a tab (each naming the file and line).
    """
    name = f"{path}:{ZIP_MEMBER}"
    try:
        with zipfile.ZipFile(path) as archive, archive.open(ZIP_MEMBER) as member:
            for lineno, line in enumerate(iter_decoded(io.BufferedReader(member), name), start=1):
                columns = line.split("\t")
                if len(columns) < 2:
                    raise DataError(f"{name}, line {lineno:,}: no tab; an export line is English<TAB>German. "
                                    "Is this a manythings.org deu-eng export?")
                yield columns[0].strip(), columns[1].strip()
    except KeyError:
        raise DataError(f"{path} holds no {ZIP_MEMBER}; is it a manythings.org deu-eng export?") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataError(f"cannot read {path}: {exc}. The zip is truncated or corrupt: fetch it again "
                        "(delete it from the cache, or replace the mirror's copy).") from None


def write_splits(export: Path, tests: dict[str, Path], folder: Path, settings: TatoebaSettings) -> dict[str, Any]:
    """Write train/dev/test ``.de`` / ``.en`` files into ``folder``; return the counts. Training pairs with a side
    in the test set are dropped; dev takes whole English sentences (all their translations), in a seeded order,
    until it holds ``settings.dev_size`` pairs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    test = {lang: read_lines(path) for lang, path in tests.items()}
    test_sides = {lang: set(lines) for lang, lines in test.items()}
    pairs, overlap = [], 0
    for en, de in read_export(export):
        if en in test_sides["en"] or de in test_sides["de"]:
            overlap += 1
        else:
            pairs.append((de, en))
    english = sorted({en for _, en in pairs})
    random.Random(settings.dev_seed).shuffle(english)
    translations = Counter(en for _, en in pairs)
    dev_sentences: set[str] = set()
    dev_pairs = 0
    for en in english:
        if dev_pairs >= settings.dev_size:
            break
        dev_sentences.add(en)
        dev_pairs += translations[en]
    splits = {"train": [p for p in pairs if p[1] not in dev_sentences],
              "dev": [p for p in pairs if p[1] in dev_sentences],
              "test": list(zip(test["de"], test["en"]))}
    for split, split_pairs in splits.items():
        for index, lang in enumerate(("de", "en")):
            write_bytes_durably(folder / f"{split}.{lang}", "".join(p[index] + "\n" for p in split_pairs).encode())
    return {"export_pairs": len(pairs) + overlap, "dropped_test_overlap": overlap,
            **{f"{split}_pairs": len(p) for split, p in splits.items()}, "settings": asdict(settings)}

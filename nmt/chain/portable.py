"""A kept workdir names no machine's folders: the text files a chain keeps have their absolute paths rewritten as
the workdir sees them (``make_portable``), so that a workdir committed or copied elsewhere says the same thing."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from nmt.common.files import write_text_durably

KEPT_SUFFIXES = (".yaml", ".json", ".log", ".md")
SKIPPED_FOLDERS = ("checkpoints", "translations", "tensorboard", ".hydra", "mps")
SKIPPED_FILES = ("running.json",)  # the note of running stages: a call's own, never kept
MIRROR_DEFAULT = "${oc.env:NMT_DATA_MIRROR,null}"  # configs/data/*.yaml's own value of data.mirror
_PROJECT_FILE = r"(?:(?:nmt|nmt_runtime|nmt_tools|scripts)/[\w/]+\.py|\w+\.py\b)"
_CHECKOUT = re.compile(r"(?<![\w.$:/-])/[^\s'\"\[\],:=]*?/(?=" + _PROJECT_FILE + ")")  # the shortest: keeps nmt/...
_INTERPRETER = re.compile(r"(?<![\w.$:/-])/[^\s'\"\[\],:=]*/bin/python[\d.]*(?![\w/.])")
_CONFIG_MIRROR = re.compile(r"^(\s*mirror:) /\S.*$", re.MULTILINE)
_ABSOLUTE = re.compile(r"(?<![\w.$~:/-])/(?:[\w.-]+/)+[\w.-]+")  # what ``leftover_paths`` looks for


def kept_files(workdir: Path) -> Iterator[Path]:
    """The text files of ``workdir/runs`` that a kept workdir holds (no checkpoints, translations or caches)."""
    for folder, subfolders, names in os.walk(workdir / "runs"):
        subfolders[:] = [s for s in subfolders if s not in SKIPPED_FOLDERS]
        yield from (Path(folder) / name for name in sorted(names)
                    if name.endswith(KEPT_SUFFIXES) and name not in SKIPPED_FILES)


def mirrors_in(workdir: Path) -> set[str]:
    """The corpus mirrors the workdir's runs read (their ``config.yaml``'s ``mirror:``) and this process's."""
    found = {m.group(0).split(":", 1)[1].strip() for path in workdir.glob("runs/**/config.yaml")
             for m in _CONFIG_MIRROR.finditer(path.read_text(encoding="utf-8", errors="replace"))}
    if os.environ.get("NMT_DATA_MIRROR", "").startswith("/"):
        found.add(os.environ["NMT_DATA_MIRROR"])
    return {m.rstrip("/") for m in found if m.rstrip("/")}


def recorded_roots(workdir: Path) -> set[str]:
    """Where the workdir was when its runs were written (a copied or cloned one was elsewhere): each
    ``results.json``'s ``run_dir`` less the run's own path in the workdir; and where it is now."""
    roots = {str(workdir), str(workdir.resolve())}
    for path in workdir.glob("runs/**/results.json"):
        run_dir = str(json.loads(path.read_text(encoding="utf-8")).get("run_dir") or "")
        own = "/" + path.parent.relative_to(workdir).as_posix()
        if run_dir.startswith("/") and run_dir.endswith(own):
            roots.add(run_dir.removesuffix(own))
    return {root for root in roots if root.strip("/")}


def portable_text(text: str, roots: Iterable[str], mirrors: Iterable[str] = ()) -> str:
    """``text`` with its absolute paths rewritten: a path under the workdir (``roots``: where it is and was)
    relative to it (``runs/best_de-en/seed42``; the workdir itself ``.``), a project file under a checkout without
    the checkout (``train.py``, ``nmt/analysis/compare.py``), an interpreter ``python``, a corpus mirror
    ``$NMT_DATA_MIRROR`` and a config's ``mirror:`` the data config's own ``${oc.env:NMT_DATA_MIRROR,null}``.
    Idempotent: a portable text stays as it is."""
    text = _CONFIG_MIRROR.sub(lambda m: f"{m.group(1)} '{MIRROR_DEFAULT}'", text)
    for root in sorted(roots, key=len, reverse=True):
        text = re.sub(re.escape(root) + r"/", "", text)
        text = re.sub(re.escape(root) + r"(?![\w.-])", ".", text)
    for mirror in sorted(mirrors, key=len, reverse=True):
        text = re.sub(re.escape(mirror) + r"(?![\w.-])", "$NMT_DATA_MIRROR", text)
    return _CHECKOUT.sub("", _INTERPRETER.sub("python", text))


def make_portable(workdir: Path, files: Iterable[Path] | None = None) -> list[Path]:
    """Rewrite ``files`` (default: every kept file of the workdir: no translations, checkpoints or binary files) in
    place, each atomically; the ones changed."""
    roots, mirrors = recorded_roots(workdir), mirrors_in(workdir)
    changed = []
    for path in kept_files(workdir) if files is None else files:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        portable = portable_text(text, roots, mirrors)
        if portable != text:
            write_text_durably(path, portable)
            changed.append(path)
    return changed


def leftover_paths(workdir: Path) -> dict[Path, list[str]]:
    """Absolute paths still in the workdir's kept files (each file's first few): what a check reports."""
    found = {}
    for path in kept_files(workdir):
        hits = _ABSOLUTE.findall(path.read_text(encoding="utf-8", errors="replace"))
        if hits:
            found[path] = hits[:3]
    return found

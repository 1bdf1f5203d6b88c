"""Fetching: a named file into the cache from a mirror folder or its public URL, renamed into place only after its
sha256 checks out, so an interrupted or corrupt download never poses as a good one.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from nmt.common.files import replace_durably
from nmt.data.errors import DataError

log = logging.getLogger(__name__)

MIRROR_ENV = "NMT_DATA_MIRROR"
DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_url(url: str, dest: Path) -> None:
    """Stream ``url`` into ``dest``. Tests monkeypatch this function so they never touch the network.

    Raises:
        urllib.error.URLError, OSError: the download failed (no network, 404, timeout, ...).
    """
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, _CHUNK)


def mirror_folder(configured: str | Path | None) -> Path | None:
    """``data.mirror`` when it is a folder here, else ``$NMT_DATA_MIRROR`` when that is one, else None (warning
    about a mirror that is not a folder): a run trained elsewhere then decodes here with no edited config.
    """
    path, fallback = (Path(str(p)).expanduser() if p else None for p in (configured, os.environ.get(MIRROR_ENV)))
    if path is not None and path.is_dir():
        return path
    if fallback is not None and fallback.is_dir():
        if path is not None:
            log.warning("data mirror %s is not a folder; using %s=%s instead", path, MIRROR_ENV, fallback)
        return fallback
    if path or fallback:
        log.warning("data mirror %s is not a folder; ignoring it", path or fallback)
    return None


def _mirror_candidates(mirror: Path, corpus: str, name: str) -> list[Path]:
    # Accept both layouts: <mirror>/multi30k/<file> (the shared corpora folder) and <mirror>/<file>.
    return [mirror / corpus / name, mirror / name]


def fetch_file(name: str, url: str, dest_dir: Path, *, sha256: str, corpus: str, mirror: Path | None = None) -> Path:
    """Return ``dest_dir/name``, verified, fetching it from the mirror or ``url`` when needed.

    A file already in ``dest_dir`` whose hash matches is used as is; a fetched one is renamed into place only
    after its hash checks out.

    Args:
        name: file name, the same in the cache, the mirror and the URL (``train.de.gz``).
        sha256: the known hex sha256.
        corpus: the corpus name, for the ``<mirror>/<corpus>/<name>`` layout and messages.

    Raises:
        DataError: the hash does not match (the bad copy is removed), or the file could not be had.
    """
    dest = dest_dir / name
    if dest.is_file():
        if (actual := sha256_of(dest)) == sha256:
            return dest
        # A cached copy that went bad (disk, manual edit): fetch it again rather than fail.
        log.warning("cached %s has sha256 %s, expected %s; fetching it again", dest, actual, sha256)
        dest.unlink()

    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=dest_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        source = _fill_from_mirror_or_url(tmp, name, url, corpus=corpus, mirror=mirror)
        if (actual := sha256_of(tmp)) != sha256:
            raise DataError(f"sha256 mismatch for {name} (from {source}): expected {sha256}, got {actual}. The bad "
                            "copy was removed. If it came from the mirror, replace the mirror's file with a fresh "
                            f"download of {url}; otherwise retry (the download may have been cut).")
        replace_durably(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("fetched %s from %s (sha256 ok)", dest, source)
    return dest


def _fill_from_mirror_or_url(tmp: Path, name: str, url: str, *, corpus: str, mirror: Path | None) -> str:
    """Copy the file into ``tmp`` from the mirror or the network; return where it came from."""
    if mirror is not None:
        for candidate in _mirror_candidates(mirror, corpus, name):
            if candidate.is_file():
                shutil.copyfile(candidate, tmp)
                return str(candidate)
    try:
        download_url(url, tmp)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        looked = "no mirror (none set)" if mirror is None else (
            f"the mirror {mirror} (looked for {' and '.join(map(str, _mirror_candidates(mirror, corpus, name)))})")
        raise DataError(f"could not get {name}: tried {looked}, then {url} ({exc}). Without network, put the file in "
                        f"a mirror folder as <mirror>/{corpus}/{name} or <mirror>/{name} and set data.mirror=<mirror> "
                        f"or the environment variable {MIRROR_ENV}=<mirror>; or copy it into {tmp.parent}/ "
                        "yourself.") from exc
    return url



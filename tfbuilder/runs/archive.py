"""A checkpoint file checked before torch reads it (no Lightning here).

``torch.save`` writes a zip archive whose entries are stored uncompressed, each with its CRC-32.
Before :func:`torch.load` (``weights_only=True``) unpickles anything, the file must be a regular
file (not a FIFO, a device or a ``/proc`` file), a zip archive whose entries are all stored
uncompressed (so nothing can expand beyond the file's own size: no zip bomb), and every entry's
bytes must match its CRC-32 (a flipped byte or a truncated file is named as damage, not unpickled).
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

from tfbuilder.errors import TfbuilderError
from tfbuilder.streams import describe

CHUNK = 1 << 20
# Entries every torch.save since PyTorch 1.10 writes (<folder>/data.pkl, ...); the newer metadata
# entries (.format_version, .storage_alignment, .data/serialization_id) are optional to torch.load.
REQUIRED = frozenset({"data.pkl", "version", "byteorder"})


class ArchiveError(TfbuilderError):
    """A checkpoint file is not a sound PyTorch zip archive."""


def check_archive(path: Path) -> None:
    """Raise :class:`ArchiveError` unless ``path`` is a regular, non-empty zip archive of stored
    entries whose CRCs match."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ArchiveError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else f"not a regular file ({describe(path)})"
        raise ArchiveError(f"checkpoint {path} is {kind}")
    if info.st_size == 0:
        raise ArchiveError(f"checkpoint {path} is empty (or a /proc file): not a checkpoint")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            if not entries:
                raise ArchiveError(f"damaged checkpoint {path}: an empty archive")
            folders = {e.filename.split("/", 1)[0] for e in entries}
            names = {e.filename.split("/", 1)[-1] for e in entries}
            absent = sorted(REQUIRED - names)
            if len(folders) != 1 or absent:
                what = f"{', '.join(absent)} missing" if absent else "entries in more than one folder"
                raise ArchiveError(f"damaged checkpoint {path}: {what} (not an archive torch.save wrote whole)")
            for entry in entries:
                if entry.compress_type != zipfile.ZIP_STORED:
                    raise ArchiveError(
                        f"checkpoint {path} holds compressed entries ({entry.filename}): not one torch.save wrote"
                    )
                if entry.file_size > info.st_size:
                    raise ArchiveError(f"damaged checkpoint {path}: entry {entry.filename} is larger than the file")
                _check_crc(archive, entry, path)
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"damaged checkpoint {path}: {exc} (not a PyTorch zip archive, or truncated)") from None
    except (OSError, EOFError, ValueError, NotImplementedError, OverflowError, UnicodeDecodeError) as exc:
        raise ArchiveError(
            f"damaged checkpoint {path}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
        ) from None


def _check_crc(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, path: Path) -> None:
    """Read ``entry`` in chunks (bounded memory): zipfile compares its CRC-32 at the end and raises
    BadZipFile on a mismatch."""
    with archive.open(entry) as f:
        while f.read(CHUNK):
            pass

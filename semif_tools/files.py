"""The files that a records, outcomes or capture argument names.

A file is read as it is. A folder is read as ``aws s3 sync`` leaves an S3 prefix in the dated
layout that Data Capture and Model Monitor's ground truth both use
(``<prefix>/yyyy/mm/dd/hh/<file>.jsonl``): every ``*.jsonl`` file under it, however deep, in
path order, which is date order in that layout (the parts are zero-padded). ``s3://`` URIs are
not read directly: sync them to a folder first and name the folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["PATTERN", "data_files"]

PATTERN = "*.jsonl"  # the files a folder contributes (AWS's capture and ground-truth files)


def data_files(paths: Iterable[Path | str]) -> list[Path]:
    """The files named, each folder replaced by the ``PATTERN`` files under it in path order.
    A name that is neither a file nor a folder, a folder without such a file, and an
    ``s3://`` URI are refused (``FileNotFoundError``, ``ValueError``), each naming the path."""
    files: list[Path] = []
    for name in paths:
        if str(name).startswith("s3:"):
            raise ValueError(
                f"{name}: s3:// URIs are not read directly; `aws s3 sync` the prefix to a "
                "folder and name the folder"
            )
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob(PATTERN) if p.is_file())
            if not found:
                raise FileNotFoundError(f"{path}: no {PATTERN} file in this folder or under it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return files

"""Text corpora to tokenize: a text file, a folder, JSONL, Parquet, or the installed Python sources.

A source is a list of files, each read by its suffix: `.jsonl` (one JSON object a line, its
`text` string a document; gzipped as `.jsonl.gz` or `.json.gz`, C4's layout), `.parquet` (its
`text` column, one document a row; needs pyarrow), anything else as one text document. A folder
gives its .txt, .md, .py, JSONL and .parquet files, recursively, hidden folders skipped, sorted
by relative path.

`python-sources` names the .py files of the running Python's standard library and then its
site-packages (sysconfig's `stdlib` and `purelib`), each sorted by relative path, whole files
up to PYTHON_SOURCES_CAP bytes: the same corpus on every machine with the same installation,
recorded with the Python version, the folders, the file count, the bytes and a hash of the list.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import data_path, special_kind
from .tokens import DataError

PYTHON_SOURCES = "python-sources"
PYTHON_SOURCES_CAP = 200 * 1024 * 1024  # 200 MiB: about 50M BPE tokens, enough for 100M models
TEXT_SUFFIXES = (".txt", ".md", ".py")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz")
RECORD_SUFFIXES = (*JSONL_SUFFIXES, ".parquet")
PARQUET_BATCH_ROWS = 1024

Document = tuple[str | bytes, int]  # (a document, the source bytes read to get it)


def text_files(root: Path, suffixes: tuple[str, ...], skip: set[str]) -> list[Path]:
    """Regular files under root with one of `suffixes`, sorted by relative path; no hidden or
    `skip` folders (a .git or .venv inside a corpus folder is no corpus)."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in skip]
        found += [Path(folder, name) for name in names if name.endswith(suffixes)]
    found = [file for file in found if file.is_file()]  # no pipes or devices named *.txt
    return sorted(found, key=lambda file: file.relative_to(root).as_posix())


def list_hash(files: list[Path], sizes: list[int], roots: list[Path]) -> str:
    """sha256 of the files' paths (relative to their root) and sizes, one line each."""
    digest = hashlib.sha256()
    for file, size in zip(files, sizes, strict=True):
        root = next(r for r in roots if file.is_relative_to(r))
        digest.update(f"{file.relative_to(root).as_posix()}\t{size}\n".encode())
    return digest.hexdigest()


@dataclass
class Corpus:
    kind: str  # "python-sources", "text-file", "jsonl", "parquet" or "folder"
    files: list[Path]
    sizes: list[int]  # bytes of each file
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def documents(self) -> Iterator[Document]:
        """Every document of every file, in order."""
        for file, size in zip(self.files, self.sizes, strict=True):
            yield from read_documents(file, size)


def python_sources(cap: int | None = None) -> Corpus:
    """The installed Python's .py sources, stdlib first, whole files while they fit in `cap`
    bytes (None: PYTHON_SOURCES_CAP)."""
    cap = PYTHON_SOURCES_CAP if cap is None else cap
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["purelib"])]
    listed: list[Path] = []
    for root in roots:  # site-packages inside the stdlib folder is read second, not twice
        skip = {"site-packages", "dist-packages"} if root == roots[0] else set()
        seen = set(listed)
        listed += [f for f in text_files(root, (".py",), skip) if f not in seen]
    files, sizes, total = [], [], 0
    for file in listed:
        size = file.stat().st_size
        if total + size > cap:
            break
        files.append(file)
        sizes.append(size)
        total += size
    provenance = {
        "kind": PYTHON_SOURCES,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "stdlib": str(roots[0]),
        "purelib": str(roots[1]),
        "cap_bytes": cap,
        "files": len(files),
        "bytes": total,
        "file_list_sha256": list_hash(files, sizes, roots),
    }
    return Corpus(PYTHON_SOURCES, files, sizes, provenance)


def open_corpus(source: str | Path) -> Corpus:
    """The corpus `source` names: python-sources, or a file or folder of text or records."""
    if str(source) == PYTHON_SOURCES:
        return python_sources()
    path = data_path(source)
    assert path is not None
    if path.is_dir():
        files = text_files(path, TEXT_SUFFIXES + RECORD_SUFFIXES, skip=set())
        if not files:
            suffixes = ", ".join(TEXT_SUFFIXES + RECORD_SUFFIXES)
            raise DataError(f"folder {path} has no {suffixes} files")
        kind, roots = "folder", [path]
    elif path.is_file():
        files, roots = [path], [path.parent]
        kind = "jsonl" if path.name.endswith(JSONL_SUFFIXES) else "text-file"
        kind = "parquet" if path.suffix == ".parquet" else kind
    else:
        raise DataError(f"source {path} is not a file or folder: {special_kind(path)}")
    sizes = [file.stat().st_size for file in files]
    if not any(sizes):
        raise DataError(f"source {path} is empty")
    for file in files:
        if file.suffix == ".parquet":
            _parquet_file(file)  # pyarrow there, a text column: refused before any work
    provenance = {"kind": kind, "path": str(path), "files": len(files), "bytes": sum(sizes),
                  "file_list_sha256": list_hash(files, sizes, roots)}  # fmt: skip
    return Corpus(kind, files, sizes, provenance)


def read_documents(file: Path, size: int) -> Iterator[Document]:
    if file.name.endswith(JSONL_SUFFIXES):
        yield from _jsonl_documents(file)
    elif file.suffix == ".parquet":
        yield from _parquet_documents(file, size)
    else:
        yield _read_bytes(file), size


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as error:
        raise DataError(f"cannot read {file}: {error.strerror}") from None


def _jsonl_documents(file: Path) -> Iterator[Document]:
    """The `text` string of each line's JSON object (blank lines skipped); a gzipped file is
    counted in its compressed bytes."""
    try:
        with file.open("rb") as raw:
            lines = gzip.GzipFile(fileobj=raw) if file.suffix == ".gz" else raw
            done = 0
            for number, line in enumerate(lines, start=1):
                text = _record_text(file, number, line) if line.strip() else ""
                position = raw.tell()
                yield text, position - done
                done = position
    except (OSError, EOFError) as error:  # unreadable, not gzip, or cut short
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise DataError(f"cannot read {file}: {reason}") from None


def _record_text(file: Path, number: int, line: bytes) -> str:
    try:
        record = json.loads(line.strip())
    except json.JSONDecodeError as error:
        where = f"{error.msg} at column {error.colno}"
        raise DataError(f"{file} line {number} is not JSON: {where}") from None
    except UnicodeDecodeError:
        raise DataError(f"{file} line {number} is not UTF-8 text") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise DataError(f'{file} line {number} has no "text" string')
    return text


def _parquet_file(file: Path) -> Any:
    """pyarrow's ParquetFile of `file`, checked to have a `text` column."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {file} needs pyarrow (pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(file)
    except Exception as error:  # pyarrow's ArrowInvalid and OSError: not a Parquet file
        raise DataError(f"{file} is not a Parquet file: {error}") from None
    if "text" not in parquet.schema_arrow.names:
        columns = ", ".join(parquet.schema_arrow.names)
        raise DataError(f"{file} has no text column (columns: {columns})")
    return parquet


def _parquet_documents(file: Path, size: int) -> Iterator[Document]:
    """The `text` column's strings (nulls skipped); progress counts the file's bytes pro rata."""
    parquet = _parquet_file(file)
    rows = max(parquet.metadata.num_rows, 1)
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=["text"]):
            texts = batch.column(0).to_pylist()
            share = size * len(texts) // rows
            for index, text in enumerate(texts):
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{file}: the text column holds {type(text).__name__} values")
                yield text or "", share if index == 0 else 0
    except DataError:
        raise
    except Exception as error:  # a corrupt page or a truncated file
        raise DataError(f"cannot read {file}: {error}") from None

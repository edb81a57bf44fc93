"""Small randomly initialised models of each supported architecture, saved as local model directories.

Each gets a tokenizer of its architecture's real kind (WordPiece for BERT, DistilBERT and ELECTRA,
byte-level BPE for RoBERTa, BART and GPT-2, SentencePiece Unigram for XLM-RoBERTa, ALBERT and T5),
trained here on a few sentences, so special tokens, offsets and pair layouts are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    AlbertConfig,
    AlbertModel,
    AlbertTokenizer,
    AutoTokenizer,
    BartConfig,
    BartModel,
    BartTokenizer,
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    GPT2Config,
    GPT2Model,
    GPT2Tokenizer,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaModel,
    RobertaTokenizer,
    T5Config,
    T5Model,
    T5Tokenizer,
    XLMRobertaConfig,
    XLMRobertaModel,
    XLMRobertaTokenizer,
)

from bertology.models import default_model_path

ARCHITECTURES = ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra")

CORPUS = [
    "I went to the store. At the store, I bought fresh strawberries.",
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Attention heads in transformers often look at the previous or the next token.",
    "She said that the committee would publish its findings next week.",
    "Unbelievably, the tokenizer splits uncommon words into several pieces.",
    "Researchers measured how much each head attends to punctuation and separators.",
] * 20

SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
#: RoBERTa-family positions start after the padding id (1), so 64 tokens need 66 positions.
ROBERTA_LIKE = {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66}


def _byte_level_bpe(specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=specials)
    model = json.loads(trainer.to_str())["model"]
    merges = [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in model["merges"]
    ]
    return model["vocab"], merges


def _roberta_tokenizer() -> PreTrainedTokenizerBase:
    vocab, merges = _byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=60)


def _unigram_vocab(specials: list[str]) -> list[tuple[str, float]]:
    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=300, special_tokens=specials, unk_token="<unk>")
    return [tuple(entry) for entry in json.loads(trainer.to_str())["model"]["vocab"]]


def _build(architecture: str) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    if architecture in ("bert", "distilbert", "electra"):
        tokenizer = AutoTokenizer.from_pretrained(default_model_path(), model_max_length=64)
        vocab = tokenizer.vocab_size
        if architecture == "bert":
            return BertModel(BertConfig(vocab_size=vocab, **SMALL)), tokenizer
        if architecture == "electra":
            return ElectraModel(ElectraConfig(vocab_size=vocab, embedding_size=16, **SMALL)), tokenizer
        config = DistilBertConfig(
            vocab_size=vocab, dim=32, n_layers=3, n_heads=4, hidden_dim=64, max_position_embeddings=64
        )
        return DistilBertModel(config), tokenizer
    if architecture == "roberta":
        tokenizer = _roberta_tokenizer()
        return RobertaModel(RobertaConfig(vocab_size=len(tokenizer), **ROBERTA_LIKE)), tokenizer
    if architecture == "xlm-roberta":
        vocab = _unigram_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tokenizer = XLMRobertaTokenizer(vocab=vocab, model_max_length=62)
        return XLMRobertaModel(XLMRobertaConfig(vocab_size=len(tokenizer), **ROBERTA_LIKE)), tokenizer
    if architecture == "albert":
        vocab = _unigram_vocab(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"])
        tokenizer = AlbertTokenizer(vocab=vocab, model_max_length=64)
        config = AlbertConfig(vocab_size=len(tokenizer), embedding_size=16, **SMALL)
        return AlbertModel(config), tokenizer
    raise ValueError(architecture)


#: Encoder-decoder and decoder-only architectures (see :func:`save_tiny_model`).
GENERATIVE_ARCHITECTURES = ("bart", "t5", "gpt2")


def _build_generative(architecture: str) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """BART (3 encoder, 2 decoder layers), T5 (2 + 2) and GPT-2 (2 layers), 4 heads each."""
    if architecture == "bart":
        vocab, merges = _byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tokenizer = BartTokenizer(vocab=vocab, merges=merges, model_max_length=64)
        layers = {"encoder_layers": 3, "decoder_layers": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}
        heads = {"encoder_attention_heads": 4, "decoder_attention_heads": 4}
        config = BartConfig(
            vocab_size=len(tokenizer), d_model=32, max_position_embeddings=64, **layers, **heads
        )
        return BartModel(config), tokenizer
    if architecture == "t5":
        vocab = _unigram_vocab(["<pad>", "</s>", "<unk>"])
        tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=64)
        layers = {"num_layers": 2, "num_decoder_layers": 2, "num_heads": 4}
        sizes = {"d_model": 32, "d_kv": 8, "d_ff": 64, "relative_attention_num_buckets": 8}
        config = T5Config(vocab_size=len(tokenizer), decoder_start_token_id=0, **layers, **sizes)
        return T5Model(config), tokenizer
    if architecture == "gpt2":
        vocab, merges = _byte_level_bpe(["<|endoftext|>"])
        tokenizer = GPT2Tokenizer(vocab=vocab, merges=merges, model_max_length=64)
        end = tokenizer.eos_token_id
        sizes = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}
        config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=end, eos_token_id=end, **sizes)
        return GPT2Model(config), tokenizer
    raise ValueError(architecture)


def save_tiny_model(architecture: str, directory: Path) -> Path:
    """Build a random ``architecture`` model with its tokenizer and save both under ``directory``."""
    torch.manual_seed(0)
    build = _build_generative if architecture in GENERATIVE_ARCHITECTURES else _build
    model, tokenizer = build(architecture)
    target = directory / architecture
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target

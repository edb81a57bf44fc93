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

from bertology.models.loading import LoadedModel, default_model_path, load_model

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
    if architecture in GENERATIVE_ARCHITECTURES:
        build = _build_generative
    elif architecture in ARCHITECTURES:
        build = _build
    else:
        build = _build_more
    model, tokenizer = build(architecture)
    target = directory / architecture
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


# --- Every other supported model type (issue 14): built from its config, 2 layers, 4 heads, width 32 ----

#: Encoders added beside the six above: the AttentionInterface ones, then those that compute attention in
#: their own code (DeBERTa, MPNet, Megatron-BERT, RoFormer: bertology's module route).
MORE_ENCODERS = (
    "camembert", "ernie", "data2vec-text", "xmod", "roc_bert", "xlm-roberta-xl", "modernbert",
    "nomic_bert", "gte", "mobilebert", "deberta", "deberta-v2", "mpnet", "megatron-bert", "roformer",
)  # fmt: skip
#: Decoder-only language models beside GPT-2; grouped-query attention (fewer key/value heads than query
#: heads) in all but Llama's own count check, sliding windows of 8 tokens in Mistral and Gemma 2 / 3.
DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
#: Every encoder and decoder type bertology captures (the parametrised model-type tests run over these).
SINGLE_STACK_TYPES = (*ARCHITECTURES, *MORE_ENCODERS, "gpt2", *DECODERS)

TWO_LAYERS = {**SMALL, "num_hidden_layers": 2}
TWO_LAYERS_ROBERTA_LIKE = {**ROBERTA_LIKE, "num_hidden_layers": 2}
#: Decoders: 4 query heads of 8 dimensions sharing 2 key/value heads (grouped-query attention).
DECODER = {**TWO_LAYERS, "num_key_value_heads": 2, "head_dim": 8}


def _wordpiece() -> PreTrainedTokenizerBase:
    """The default model's WordPiece tokenizer (BERT's uncased vocabulary)."""
    return AutoTokenizer.from_pretrained(default_model_path(), model_max_length=64)


def _bpe_with_template(cls: str, sep: str, pad: str, unk: str, mask: str) -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer with BERT's ``CLS A SEP (B SEP)`` template (ModernBERT's layout)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    trainer = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    trainer.train_from_iterator(
        CORPUS, vocab_size=400, min_frequency=1, special_tokens=[cls, sep, pad, unk, mask]
    )
    backend = Tokenizer.from_str(trainer.to_str())
    ids = {token: backend.token_to_id(token) for token in (cls, sep)}
    backend.post_processor = TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=list(ids.items()),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token=cls, sep_token=sep, pad_token=pad, unk_token=unk, mask_token=mask,
        model_max_length=64,
    )  # fmt: skip


def _sentencepiece_bpe(specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a SentencePiece-style BPE (``▁`` word starts), as Llama and Gemma use."""
    from tokenizers import SentencePieceBPETokenizer

    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=specials)
    model = json.loads(trainer.to_str())["model"]
    merges = [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in model["merges"]
    ]
    return model["vocab"], merges


def _mpnet_tokenizer() -> PreTrainedTokenizerBase:
    """MPNet's WordPiece layout: ``<s>`` 0, ``<pad>`` 1 (its position ids start after it), ``</s>`` 2."""
    from transformers import MPNetTokenizer

    words = [token for token in _wordpiece().get_vocab() if not token.startswith("[")]
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    vocab = {token: index for index, token in enumerate([*specials, *sorted(words)])}
    return MPNetTokenizer(vocab=vocab, model_max_length=64)


def _build_more(model_type: str) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A model of one of :data:`MORE_ENCODERS` or :data:`DECODERS` with its family's tokenizer kind."""
    import transformers as hf

    if model_type in ("ernie", "roc_bert", "nomic_bert", "gte", "megatron-bert", "roformer", "mobilebert"):
        tokenizer = _wordpiece()
        sizes = {"vocab_size": tokenizer.vocab_size, **TWO_LAYERS}
        if model_type == "mobilebert":  # bottlenecks of 16 inside a 32-wide residual stream
            sizes |= {"embedding_size": 16, "intra_bottleneck_size": 16, "num_feedforward_networks": 1}
        if model_type == "roc_bert":
            sizes |= {"shape_vocab_size": 8, "pronunciation_vocab_size": 8}
        config_class, model_class = {
            "ernie": (hf.ErnieConfig, hf.ErnieModel),
            "roc_bert": (hf.RoCBertConfig, hf.RoCBertModel),
            "nomic_bert": (hf.NomicBertConfig, hf.NomicBertModel),
            "gte": (hf.GteConfig, hf.GteModel),
            "megatron-bert": (hf.MegatronBertConfig, hf.MegatronBertModel),
            "roformer": (hf.RoFormerConfig, hf.RoFormerModel),
            "mobilebert": (hf.MobileBertConfig, hf.MobileBertModel),
        }[model_type]
        return model_class(config_class(**sizes)), tokenizer
    if model_type in ("camembert", "xmod", "xlm-roberta-xl"):
        vocab = _unigram_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tokenizer_class = hf.CamembertTokenizer if model_type == "camembert" else XLMRobertaTokenizer
        tokenizer = tokenizer_class(vocab=vocab, model_max_length=62)
        sizes = {"vocab_size": len(tokenizer), **TWO_LAYERS_ROBERTA_LIKE}
        if model_type == "camembert":
            return hf.CamembertModel(hf.CamembertConfig(**sizes)), tokenizer
        if model_type == "xmod":
            return hf.XmodModel(
                hf.XmodConfig(**sizes, languages=["en_XX"], default_language="en_XX")
            ), tokenizer
        return hf.XLMRobertaXLModel(hf.XLMRobertaXLConfig(**sizes)), tokenizer
    if model_type == "data2vec-text":
        tokenizer = _roberta_tokenizer()
        return hf.Data2VecTextModel(
            hf.Data2VecTextConfig(vocab_size=len(tokenizer), **TWO_LAYERS_ROBERTA_LIKE)
        ), tokenizer
    if model_type == "modernbert":
        tokenizer = _bpe_with_template("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
        ids = {
            f"{name}_token_id": tokenizer.convert_tokens_to_ids(f"[{name.upper()}]")
            for name in ("cls", "sep", "pad")
        }
        # Three layers: global attention in layer 0, a local window of 8 tokens (4 each side) in 1 and 2.
        config = hf.ModernBertConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, max_position_embeddings=64, local_attention=8,
            bos_token_id=ids["cls_token_id"], eos_token_id=ids["sep_token_id"], **ids,
        )  # fmt: skip
        return hf.ModernBertModel(config), tokenizer
    if model_type == "deberta":
        vocab, merges = _byte_level_bpe(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
        tokenizer = hf.DebertaTokenizer(vocab=vocab, merges=merges, model_max_length=64)
        config = hf.DebertaConfig(
            vocab_size=len(tokenizer), relative_attention=True, pos_att_type=["c2p", "p2c"],
            max_relative_positions=16, **TWO_LAYERS,
        )  # fmt: skip
        return hf.DebertaModel(config), tokenizer
    if model_type == "deberta-v2":  # DeBERTa-v3's settings: shared keys, log buckets, no absolute positions
        vocab = _unigram_vocab(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
        tokenizer = hf.DebertaV2Tokenizer(vocab=vocab, unk_id=3, model_max_length=64)
        config = hf.DebertaV2Config(
            vocab_size=len(tokenizer), relative_attention=True, pos_att_type=["p2c", "c2p"],
            position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
            position_biased_input=False, type_vocab_size=0, **TWO_LAYERS,
        )  # fmt: skip
        return hf.DebertaV2Model(config), tokenizer
    if model_type == "mpnet":
        tokenizer = _mpnet_tokenizer()
        config = hf.MPNetConfig(
            vocab_size=len(tokenizer), relative_attention_num_buckets=32, **TWO_LAYERS_ROBERTA_LIKE
        )
        return hf.MPNetModel(config), tokenizer
    if model_type in ("llama", "mistral", "gemma", "gemma2", "gemma3_text"):
        gemma = model_type.startswith("gemma")
        specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
        vocab, merges = _sentencepiece_bpe(specials)
        tokenizer_class = hf.GemmaTokenizer if gemma else hf.LlamaTokenizer
        tokenizer = tokenizer_class(vocab=vocab, merges=merges, model_max_length=64, add_bos_token=True)
        sizes = {"vocab_size": len(tokenizer), **DECODER}
        if model_type != "llama":
            sizes["num_key_value_heads"] = 1 if model_type == "gemma" else 2
        if model_type in ("mistral", "gemma2", "gemma3_text"):
            sizes["sliding_window"] = 8
        if gemma:
            sizes |= {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
        if model_type in ("gemma2", "gemma3_text"):
            sizes["layer_types"] = ["sliding_attention", "full_attention"]
        config_class, model_class = {
            "llama": (hf.LlamaConfig, hf.LlamaModel),
            "mistral": (hf.MistralConfig, hf.MistralModel),
            "gemma": (hf.GemmaConfig, hf.GemmaModel),
            "gemma2": (hf.Gemma2Config, hf.Gemma2Model),
            "gemma3_text": (hf.Gemma3TextConfig, hf.Gemma3TextModel),
        }[model_type]
        return model_class(config_class(**sizes)), tokenizer
    if model_type in ("qwen2", "qwen3"):
        vocab, merges = _byte_level_bpe(["<|endoftext|>"])
        tokenizer = hf.Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=64)
        end = tokenizer.eos_token_id
        sizes = {"vocab_size": len(tokenizer), "bos_token_id": end, "eos_token_id": end, **DECODER}
        if model_type == "qwen2":
            return hf.Qwen2Model(hf.Qwen2Config(**sizes)), tokenizer
        return hf.Qwen3Model(hf.Qwen3Config(**sizes)), tokenizer
    raise ValueError(model_type)


class TinyModelDirs(dict[str, Path]):
    """Saved tiny model directories by model type, each built the first time it is asked for (once per
    session: a test run that needs a few types builds only those)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, model_type: str) -> Path:
        self[model_type] = directory = save_tiny_model(model_type, self.root)
        return directory


def tiny_classifier(directory: Path, labels: tuple[str, str] = ("neg", "pos")) -> LoadedModel:
    """A random classifier whose new head is scaled up, so that its logits differ visibly between inputs."""
    torch.manual_seed(0)
    loaded = load_model(directory, classifier=True, labels=list(labels))
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if not name.startswith(loaded.model.base_model_prefix):
                parameter.mul_(30)
    return loaded


def tiny_language_model(directory: Path) -> LoadedModel:
    """A tiny random decoder saved by :func:`save_tiny_model` with a seeded language-modelling head, scaled
    up so that its next-token losses differ visibly between heads removed."""
    torch.manual_seed(0)
    loaded = load_model(directory, language_model=True)
    with torch.no_grad():
        loaded.model.get_output_embeddings().weight.mul_(30)
    return loaded


def tiny_grouped_query_llama(directory: Path) -> LoadedModel:
    """:func:`tiny_language_model` of the tiny llama, checked to share 2 key/value heads among 4 heads."""
    loaded = tiny_language_model(directory)
    assert loaded.model.config.num_key_value_heads == 2 and loaded.num_heads == 4
    return loaded


def llama_output_projections(loaded: LoadedModel) -> list[torch.nn.Module]:
    """Each layer's ``o_proj`` of a llama-style decoder, whose input is the heads' outputs side by side."""
    return [layer.self_attn.o_proj for layer in loaded.model.model.layers]


def gpt2_output_projections(loaded: LoadedModel) -> list[torch.nn.Module]:
    """Each layer's ``attn.c_proj`` of a GPT-2 (a ``Conv1D``), whose input is the heads' outputs side by
    side."""
    return [block.attn.c_proj for block in loaded.model.transformer.h]

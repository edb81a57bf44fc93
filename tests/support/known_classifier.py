"""A one-layer BERT sentiment classifier built by hand, whose prediction is known from its input's words.

Each vocabulary entry ``w`` has a sentiment ``s(w)`` (:data:`SENTIMENT`; 0 for every other entry and the
special tokens). Its word embedding is ``[s, -s, 3, -3, 3, -3, 3, -3]``: the large alternating part keeps
every embedding's mean 0 and its spread nearly constant, so the embedding LayerNorm is close to a
division by a constant. Positions and token types add nothing. The one head has zero query and key
weights, so it attends uniformly to every token, and its value and output projections carry dimension 0
alone (times :data:`GAIN`); the feed-forward block adds 0; the pooler keeps [CLS]'s vector and the
classifier reads its dimension 0. So the logit of "pos" minus that of "neg" grows with the mean
sentiment of the input's tokens: the prediction is "pos" when it is above 0, "neg" when below.

For HotFlip the best first swap is known too: the one-hot gradient estimates the loss's rise of swapping
entry ``a`` for ``b`` at a position as a positive multiple of ``s(a) − s(b)`` (the same multiple at every
position up to a few percent), so for a positive input it is the most positive word swapped for the most
negative allowed entry.
"""

from __future__ import annotations

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from bertology.models.loading import LoadedModel, default_model_path, wrap_model

#: Sentiment of the entries that have one: a word piece (``##y``) is the most negative, for the check
#: that HotFlip swaps in whole words only unless asked.
SENTIMENT = {"good": 1.0, "great": 1.0, "bad": -1.0, "awful": -2.0, "##y": -4.0}
#: How strongly the head's output carries the mean sentiment.
GAIN = 10.0
LABELS = ("neg", "pos")


def known_sentiment_classifier() -> LoadedModel:
    """The classifier of the module docstring, with all-MiniLM-L6-v2's WordPiece tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=4,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        id2label=dict(enumerate(LABELS)),
        label2id={label: number for number, label in enumerate(LABELS)},
        attn_implementation="eager",
    )
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (
            model.bert.embeddings.LayerNorm,
            model.bert.encoder.layer[0].attention.output.LayerNorm,
            model.bert.encoder.layer[0].output.LayerNorm,
        ):
            norm.weight.fill_(1.0)
        words = model.bert.embeddings.word_embeddings.weight
        words[:, 2:] = torch.tensor([3.0, -3.0] * 3)
        for token, sentiment in SENTIMENT.items():
            words[tokenizer.convert_tokens_to_ids(token), :2] = torch.tensor([sentiment, -sentiment])
        layer = model.bert.encoder.layer[0]
        layer.attention.self.value.weight[0, 0] = 1.0
        layer.attention.output.dense.weight[0, 0] = GAIN
        model.bert.pooler.dense.weight.copy_(torch.eye(8))
        model.classifier.weight[:, 0] = torch.tensor([-5.0, 5.0])
    return wrap_model(model, tokenizer, "known-sentiment")

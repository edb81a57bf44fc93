"""The allennlp convention of ``explain`` and ``attack`` equals AllenNLP Interpret's code, written again
here as it is there: gradients of the cross-entropy of the predicted label taken by hooks on the word
embedding layer of a model run from its token ids (``Predictor.get_gradients``), the interpreters'
sums, scalings and noise, and the attackers' loops (``input_reduction.py``, ``hotflip.py``)."""

from __future__ import annotations

import copy
import heapq
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.cli import run_in_process
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from bertology.errors import BertologyError
from bertology.interventions import attack, explain
from bertology.models.loading import LoadedModel, default_model_path, load_model, wrap_model

PAIR = ("Researchers measured how much each head attends to punctuation.", "The quick brown fox jumps.")
#: hotflip.py's DEFAULT_IGNORE_TOKENS.
DEFAULT_IGNORE_TOKENS = ["@@NULL@@", ".", ",", ";", "!", "?", "[MASK]", "[SEP]", "[CLS]"]

Transform = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(scope="module")
def tiny_bert(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    """A tiny random BERT with a fresh head, not scaled up: its prediction is far from certain, so the
    loss's gradient is far from rounding."""
    torch.manual_seed(0)
    return load_model(tiny_model_dirs["bert"], classifier=True, labels=["neg", "pos"])


@pytest.fixture(scope="module")
def unnormed_bert(tiny_bert: LoadedModel) -> LoadedModel:
    """``tiny_bert`` without its embedding LayerNorm. With it, the gradient by a token's word embedding
    sums to 0 over the embedding dimension (the LayerNorm ignores a shift of all components alike), so
    AllenNLP's SmoothGrad, which sums the gradient without multiplying by the input, is rounding noise
    on every BERT; without it, its sums are the model's."""
    model = copy.deepcopy(tiny_bert.model)
    model.bert.embeddings.LayerNorm = torch.nn.Identity()
    return wrap_model(model, tiny_bert.tokenizer, "unnormed")


@pytest.fixture(scope="module")
def unnormed_bert_float64(unnormed_bert: LoadedModel) -> LoadedModel:
    """``unnormed_bert`` in float64, for SmoothGrad at a noise level where the draw shows (noise 10): there
    the noisy embeddings are about 10 times the input's range and the summed gradients cancel, so float32's
    rounding (2**-24 relative per operation, amplified by that cancellation and by the order in which a
    batched and a one-sample pass add, which depends on the batch and on the thread count) reaches 1e-5.
    In float64 the same amplification leaves it near 1e-12, so the comparison at 1e-5 tests the draw and
    the sums, not the rounding."""
    return wrap_model(copy.deepcopy(unnormed_bert.model).double(), unnormed_bert.tokenizer, "unnormed64")


@pytest.fixture(scope="module")
def sst2_sentences(shared_data: Path) -> list[tuple[str, int]]:
    lines = (shared_data / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [(text.strip(), int(label)) for text, label in (line.split("\t") for line in lines)]


@pytest.fixture(scope="module")
def trained(sst2_sentences: list[tuple[str, int]]) -> LoadedModel:
    """A one-layer BERT, 16 wide, with all-MiniLM-L6-v2's tokenizer, trained on SST-2's dev sentences
    until it fits most of them."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=96,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    texts, labels = zip(*sst2_sentences, strict=True)
    for _ in range(3):
        for start in range(0, len(texts), 32):
            batch = tokenizer(list(texts[start : start + 32]), padding=True, truncation=True, max_length=64,
                              return_tensors="pt")  # fmt: skip
            loss = model(**batch, labels=torch.tensor(labels[start : start + 32])).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    return wrap_model(model, tokenizer, "sst2-small")


# --- AllenNLP's Predictor.get_gradients and interpreters, written again ---------------------------


def get_gradients(
    loaded: LoadedModel,
    inputs: dict[str, torch.Tensor],
    label: int | None,
    transform: Transform | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(embedding output [n, dim], its gradient [n, dim], probabilities, label)``: the model run from
    its token ids, a forward hook on the word embedding layer saving (and with ``transform`` changing)
    its output, the gradient of the cross-entropy of ``label`` (``None``: the prediction) by it."""
    saved: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        saved["input"] = output.detach().clone()
        changed = output if transform is None else transform(output)
        saved["output"] = changed
        return changed

    handle = loaded.model.get_input_embeddings().register_forward_hook(hook)
    try:
        with torch.enable_grad():
            logits = loaded.model(**inputs).logits
            label = int(logits[0].argmax()) if label is None else label
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([label]))
            (gradient,) = torch.autograd.grad(loss, saved["output"])
    finally:
        handle.remove()
    probabilities = torch.softmax(logits[0].detach(), -1).numpy()
    return saved["input"][0].numpy(), gradient[0].numpy(), probabilities, label


def normalise(emb_grad: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(emb_grad, ord=1)
    return np.array([abs(e) / norm for e in emb_grad])


def model_inputs(loaded: LoadedModel, text: str, text_b: str | None) -> dict[str, torch.Tensor]:
    return dict(loaded.tokenizer(text, text_b, return_tensors="pt"))


def simple_gradient(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> np.ndarray:
    embedding, grad, _, _ = get_gradients(loaded, inputs, None)
    # simple_gradient.py: numpy.sum(grad[0] * embeddings_list[input_idx][0], axis=1), where the saved
    # embeddings are output.squeeze(0) ([n, dim]): [0] is the first token's embedding
    return normalise(np.sum(grad * embedding[0], axis=1))


def integrated_gradient(loaded: LoadedModel, inputs: dict[str, torch.Tensor], steps: int = 10) -> np.ndarray:
    _, _, _, label = get_gradients(loaded, inputs, None)
    total, embedding = 0.0, None
    for alpha in np.linspace(0, 1.0, num=steps, endpoint=False):
        saved, grad, _, _ = get_gradients(loaded, inputs, label, lambda output, a=alpha: output * float(a))
        embedding = saved if alpha == 0 else embedding
        total = total + grad
    return normalise(np.sum(total / steps * embedding, axis=1))


def smooth_gradient(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], seed: int, samples: int = 10, stdev: float = 0.01
) -> np.ndarray:
    """The noise drawn as bertology documents it: one ``randn([n, dim])`` per sample from a CPU generator
    seeded with ``seed``; scaled as AllenNLP scales it."""
    generator = torch.Generator().manual_seed(seed)
    _, _, _, label = get_gradients(loaded, inputs, None)

    def noisy(output: torch.Tensor) -> torch.Tensor:
        scale = output.detach().max() - output.detach().min()
        return output + torch.randn(output.shape[1:], generator=generator)[None] * stdev * scale

    total = sum(get_gradients(loaded, inputs, label, noisy)[1] for _ in range(samples))
    return normalise(np.sum(total / samples, axis=1))


@pytest.mark.parametrize(("text", "text_b"), [("A gripping, beautifully acted film.", None), PAIR])
def test_saliency_equals_allennlps_interpreters(
    tiny_bert: LoadedModel,
    unnormed_bert: LoadedModel,
    unnormed_bert_float64: LoadedModel,
    text: str,
    text_b: str | None,
) -> None:
    for loaded, methods in ((tiny_bert, ["input-x-gradient", "integrated-gradients"]), (unnormed_bert, None)):
        inputs = model_inputs(loaded, text, text_b)
        explanation = explain(
            loaded, text, text_b, convention="allennlp", methods=methods, seed=3, batch_size=4
        )
        assert (explanation.convention, explanation.steps, explanation.samples) == ("allennlp", 10, 10)
        expected = {
            "input-x-gradient": simple_gradient(loaded, inputs),
            "integrated-gradients": integrated_gradient(loaded, inputs),
            "smoothgrad": smooth_gradient(loaded, inputs, seed=3),
        }
        assert list(explanation.attributions) == (methods or list(expected))
        for method, values in explanation.attributions.items():
            assert len(values) == len(explanation.tokens)
            # float32 both sides, batched differently: values are shares of 1 summed over the tiny model's
            # 32-wide embedding from gradients computed to about 1e-6 relative (2**-24 per operation, a few
            # hundred operations deep), so their differences stay below 1e-6; 1e-5 leaves a factor of 10
            np.testing.assert_allclose(values, expected[method], atol=1e-5, err_msg=method)
            assert abs(values.sum() - 1) < 1e-6 and values.min() >= 0
    # at a noise level where the draw shows: the same draw, and another seed's differs (in float64: see
    # unnormed_bert_float64 for why float32 cannot hold 1e-5 there)
    noisy = explain(
        unnormed_bert_float64, text, text_b, convention="allennlp", methods=["smoothgrad"], noise=10.0, seed=3
    )
    expected = smooth_gradient(unnormed_bert_float64, inputs, seed=3, stdev=10.0)
    np.testing.assert_allclose(noisy.attributions["smoothgrad"], expected, atol=1e-5)
    other_seed = smooth_gradient(unnormed_bert_float64, inputs, seed=4, stdev=10.0)
    assert np.abs(expected - other_seed).max() > 1e-4
    data = json.loads(explanation.to_json())
    assert data["convention"] == "allennlp" and len(data["attributions"]["smoothgrad"]) == len(data["tokens"])


def test_smoothgrad_sums_vanish_through_the_embedding_layernorm(tiny_bert: LoadedModel) -> None:
    embedding, gradient, _, _ = get_gradients(tiny_bert, model_inputs(tiny_bert, *PAIR), None)
    sums = np.abs(gradient.sum(axis=1))
    assert sums.max() < 1e-5 * np.linalg.norm(gradient, axis=1).max()  # hence the unnormed model above
    # times the input they do not: far above rounding (float32's 1e-7 of |gradient| |embedding|)
    scale = np.linalg.norm(gradient, axis=1).max() * np.linalg.norm(embedding, axis=1).max()
    assert np.abs((gradient * embedding).sum(axis=1)).max() > 1e-3 * scale


def test_saliency_settings_of_the_allennlp_convention(tiny_bert: LoadedModel) -> None:
    inputs = model_inputs(tiny_bert, *PAIR)
    explanation = explain(tiny_bert, *PAIR, convention="allennlp", methods=["integrated-gradients"], steps=4)
    # as above: normalised attributions of float32 gradients computed in another order differ below 1e-6
    np.testing.assert_allclose(
        explanation.attributions["integrated-gradients"], integrated_gradient(tiny_bert, inputs, 4), atol=1e-5
    )
    with pytest.raises(BertologyError, match="Unknown saliency method 'gradient' in the allennlp convention"):
        explain(tiny_bert, "fine", convention="allennlp", methods=["gradient"])
    with pytest.raises(BertologyError, match="Unknown convention 'captum'; use bertology or allennlp"):
        explain(tiny_bert, "fine", convention="captum")  # type: ignore[arg-type]
    assert explain(tiny_bert, "fine", methods=["gradient"]).convention == "bertology"


# --- AllenNLP's attackers, written again ----------------------------------------------------------


def allennlp_input_reduction(loaded: LoadedModel, text: str, beam_size: int = 3) -> list[str]:
    """``InputReduction.attack_from_json`` for a classifier: the final tokens."""
    encoded = loaded.tokenizer(text)
    instance = (list(encoded["input_ids"]), list(encoded["token_type_ids"]))

    def gradients(ids: list[int], types: list[int], label: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        inputs = {"input_ids": torch.tensor([ids]), "token_type_ids": torch.tensor([types]),
                  "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}  # fmt: skip
        _, grad, probabilities, label = get_gradients(loaded, inputs, label)
        return grad, probabilities, label

    _, _, label = gradients(*instance, None)
    current_tokens = instance[0]
    candidates = [instance]
    while len(current_tokens) > 1 and candidates:
        candidates = heapq.nsmallest(beam_size, candidates, key=lambda x: len(x[0]))
        beam_candidates = candidates
        candidates = []
        for ids, types in beam_candidates:
            grads, probabilities, _ = gradients(ids, types, label)
            if int(np.argmax(probabilities)) != label:
                continue
            current_tokens = ids
            grads_mag = [np.sqrt(grad.dot(grad)) for grad in grads]
            for _ in range(beam_size):
                smallest = int(np.argmin(grads_mag))
                if grads_mag[smallest] == float("inf"):
                    break
                grads_mag[smallest] = float("inf")
                candidates.append(
                    (ids[:smallest] + ids[smallest + 1 :], types[:smallest] + types[smallest + 1 :])
                )
    return loaded.tokenizer.convert_ids_to_tokens(current_tokens)


def allennlp_hotflip(loaded: LoadedModel, text: str) -> list[str]:
    """``Hotflip.attack_from_json`` (untargeted) for a classifier: the final tokens."""
    encoded = loaded.tokenizer(text, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    embedding_matrix = loaded.model.get_input_embeddings().weight.detach()
    invalid_replacement_indices = [
        i for token, i in loaded.tokenizer.get_vocab().items() if not token.isalnum()
    ]

    def gradients(label: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        inputs = {**encoded, "input_ids": torch.tensor([ids])}
        _, grad, probabilities, label = get_gradients(loaded, inputs, label)
        return grad, probabilities, label

    grad, _, label = gradients(None)
    flipped = [index for index, token in enumerate(loaded.tokenizer.convert_ids_to_tokens(ids))
               if token in DEFAULT_IGNORE_TOKENS]  # fmt: skip
    while True:
        grads_magnitude = [g.dot(g) for g in grad]
        for index in flipped:
            grads_magnitude[index] = -1
        index_of_token_to_flip = int(np.argmax(grads_magnitude))
        if grads_magnitude[index_of_token_to_flip] == -1:
            break
        flipped.append(index_of_token_to_flip)
        token_grad = torch.from_numpy(grad[index_of_token_to_flip]).unsqueeze(0).unsqueeze(0)
        word_embedding = embedding_matrix[ids[index_of_token_to_flip]].unsqueeze(0).unsqueeze(0)
        new_embed_dot_grad = torch.einsum("bij,kj->bik", (token_grad, embedding_matrix))
        prev_embed_dot_grad = torch.einsum("bij,bij->bi", (token_grad, word_embedding)).unsqueeze(-1)
        neg_dir_dot_grad = (-1 * (prev_embed_dot_grad - new_embed_dot_grad)).numpy()
        neg_dir_dot_grad[:, :, invalid_replacement_indices] = -np.inf
        ids[index_of_token_to_flip] = int(neg_dir_dot_grad.argmax(2)[0][0])
        grad, probabilities, _ = gradients(label)
        if int(np.argmax(probabilities)) != label:
            break
    return loaded.tokenizer.convert_ids_to_tokens(ids)


@pytest.mark.slow
def test_attacks_equal_allennlps_attackers(
    trained: LoadedModel, sst2_sentences: list[tuple[str, int]]
) -> None:
    texts = [text for text, _ in sst2_sentences if 6 <= len(text.split()) <= 14][:6]
    with torch.no_grad():
        batch = trained.tokenizer(
            [text for text, _ in sst2_sentences[:100]], padding=True, return_tensors="pt"
        )
        predicted = trained.model(**batch).logits.argmax(-1).numpy()
    assert np.mean(predicted == [label for _, label in sst2_sentences[:100]]) > 0.8  # it is trained
    removed_special = 0
    for text in texts:
        reduced = attack(trained, text, method="input-reduction", convention="allennlp")
        tokens = reduced.tokens if reduced.result is None else reduced.result.tokens
        assert tokens == allennlp_input_reduction(trained, text), text
        assert all(step.label == reduced.label for step in reduced.steps) and len(tokens) < len(
            reduced.tokens
        )
        removed_special += "[CLS]" not in tokens or "[SEP]" not in tokens
        flipped = attack(trained, text, method="hotflip", convention="allennlp")
        assert flipped.convention == "allennlp" and flipped.result is not None
        assert flipped.result.tokens == allennlp_hotflip(trained, text), text
        assert all(trained.tokenizer.convert_ids_to_tokens(entry).isalnum() for entry in flipped.result.ids
                   if entry not in trained.tokenizer.encode(text))  # fmt: skip
        assert not {step.token for step in flipped.steps} & set(DEFAULT_IGNORE_TOKENS)
    assert removed_special > 0  # AllenNLP's input reduction ignores no token ([CLS] and [SEP] may go)


def test_allennlp_attack_settings(tiny_bert: LoadedModel) -> None:
    with pytest.raises(
        BertologyError, match="AllenNLP's HotFlip swaps in alphanumeric vocabulary entries only"
    ):
        attack(tiny_bert, "fine", method="hotflip", subwords=True, convention="allennlp")
    result = attack(tiny_bert, PAIR[0], method="hotflip", convention="allennlp", max_flips=2)
    assert 1 <= len(result.steps) <= 2 and json.loads(result.to_json())["convention"] == "allennlp"


def test_commands_take_the_allennlp_convention(
    tiny_bert: LoadedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tmp_path / "run")
    tiny_bert.model.save_pretrained(tmp_path / "run" / "model")
    tiny_bert.tokenizer.save_pretrained(tmp_path / "run" / "model")
    why, flipped = tmp_path / "why.html", tmp_path / "flipped.html"
    code, stderr = run_in_process(
        ["explain", model, PAIR[0], "--convention", "allennlp", "-o", str(why)], capsys
    )
    assert code == 0, stderr
    data = json.loads(why.with_suffix(".json").read_text())
    assert (data["convention"], data["steps"], data["samples"]) == ("allennlp", 10, 10)
    for values in data["attributions"].values():
        assert len(values) == len(data["tokens"]) and abs(sum(values) - 1) < 1e-5
    assert "allennlp (AllenNLP Interpret" in why.read_text()
    command = [
        "attack",
        model,
        PAIR[0],
        "--method",
        "hotflip",
        "--convention",
        "allennlp",
        "-o",
        str(flipped),
    ]
    code, stderr = run_in_process(command, capsys)
    assert code == 0, stderr
    assert json.loads(flipped.with_suffix(".json").read_text())["convention"] == "allennlp"
    code, stderr = run_in_process(["explain", model, "fine", "--convention", "captum"], capsys)
    shown = " ".join(stderr.replace("│", " ").split())  # however the error panel wraps it
    assert code == 2 and "'captum' is not one of 'bertology', 'allennlp'." in shown, stderr
    code, stderr = run_in_process(["attack", model, "fine", "--convention", "allennlp", "--subwords"], capsys)
    shown = " ".join(stderr.split())
    assert (
        code == 1
        and shown.startswith("Error: AllenNLP's HotFlip swaps in alphanumeric")
        and "Traceback" not in shown
    )
    command = ["explain", model, "fine", "--convention", "allennlp", "--method", "gradient"]
    code, stderr = run_in_process(command, capsys)
    shown = " ".join(stderr.split())
    assert code == 1 and shown == (
        "Error: Unknown saliency method 'gradient' in the allennlp convention; use input-x-gradient, "
        "integrated-gradients, smoothgrad."
    ), stderr

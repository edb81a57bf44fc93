"""Benchmark activation and attribution patching on the IOI pairs (issue 36).

1. Exact patching of every head of ``--layers`` (default: all) of smollm2-135m on the first ``--pairs``
   IOI pairs (``bertology.interventions.ioi_pairs``), denoising: ``patch``'s organisation (the clean and
   corrupted passes recorded once, for each layer ``l`` only layers ``l..`` run, and only at the positions
   from the first one where a pair's clean and corrupted tokens differ, the earlier positions' keys and
   values cached once; ``--patches-per-pass`` heads side by side, the last token's logits only) against
   the plain loop TransformerLens's ``get_act_patch_attn_head_out_all_pos`` runs: for each head one whole
   forward pass of the corrupted inputs with a forward pre-hook on the output projection that puts in the
   head's clean output (the clean outputs recorded by one clean pass first). With ``--every-position``
   also the same organisation run at every position (``skip_shared_prefix=False``, as before the shared
   start was skipped). All give the same LDs (checked, 1e-4).
2. Attribution patching of every head (``method="attribution"``: one clean pass, one corrupted forward
   and backward pass) against one plain forward pass of the corrupted inputs.
3. Attribution patching's agreement with exact patching on the heads of ``--layers``: the Pearson
   correlation of their effects and the top-10 agreement by absolute effect
   (:meth:`~bertology.interventions.patching.PatchingStudy.agreement`).

Each timing is the best of ``--repeats``, in wall-clock seconds and in this process's CPU seconds
(``time.process_time``: with one torch thread the work done, whatever else shares the machine); the ratios
are taken in the same run on the same machine, of both.
Torch runs ``--threads`` threads (default 1: on a shared 2-core machine two OpenMP threads wait on each
other and a forward pass takes about 5 times as long as with one).

Run: ``python benchmarks/bench_patching.py [--pairs 18] [--layers 0,15,29] [--repeats 1] [--threads 1]
[--every-position]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from bertology.interventions import patching
from bertology.interventions.patching import (
    PatchingResult,
    grid_patches,
    patch,
)
from bertology.interventions.patching_metrics import logit_difference
from bertology.interventions.patching_pairs import encode_pairs, ioi_pairs, read_pairs
from bertology.models.anatomy import attention_parts
from bertology.models.loading import LoadedModel, load_model


def best_of(repeats: int, work: Callable[[], object]) -> tuple[np.ndarray, object]:
    """([wall seconds, CPU seconds] of the fastest of ``repeats`` calls of ``work``, its result)."""
    times, result = [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return np.array(min(times)), result


def plain_loop(
    loaded: LoadedModel, clean: dict, corrupted: dict, answer, wrong, layers: list[int]
) -> np.ndarray:
    """[layers, heads, pairs] LD: one hooked corrupted forward pass per head, full logits."""
    parts = attention_parts(loaded.model)
    saved: list[torch.Tensor] = []
    handles = [p.output.register_forward_pre_hook(lambda _, a: saved.append(a[0])) for p in parts]
    loaded.model(**clean)
    for handle in handles:
        handle.remove()
    d = parts[0].head_dim
    result = np.zeros((len(layers), loaded.num_heads, clean["input_ids"].shape[0]))
    for row, layer in enumerate(layers):
        for head in range(loaded.num_heads):

            def swap(_: torch.nn.Module, args: tuple, layer: int = layer, head: int = head) -> tuple:
                patched = args[0].clone()
                patched[..., head * d : (head + 1) * d] = saved[layer][..., head * d : (head + 1) * d]
                return (patched,)

            handle = parts[layer].output.register_forward_pre_hook(swap)
            logits = loaded.model(**corrupted).logits
            handle.remove()
            result[row, head] = logit_difference(logits, answer, wrong).numpy()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--pairs", type=int, default=18)
    parser.add_argument("--layers", default="", help="comma-separated layers (default: all)")
    parser.add_argument("--patches-per-pass", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--every-position", action="store_true", help="also time exact patching run at every position"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, language_model=True)
    loaded.model.eval()
    pairs = read_pairs(ioi_pairs())[: args.pairs]
    layers = [int(x) for x in args.layers.split(",")] if args.layers else list(range(loaded.num_layers))
    (group,) = encode_pairs(loaded, pairs).groups
    plain = {key: value for key, value in group.clean.items() if key != "logits_to_keep"}
    plain_corrupted = {key: value for key, value in group.corrupted.items() if key != "logits_to_keep"}
    shared = patching.shared_prefix(group)
    print(
        f"{args.model}: {len(pairs)} pairs of {group.tokens} tokens, the first {shared} shared, layers "
        f"{layers}, torch threads {torch.get_num_threads()}"
    )

    with torch.no_grad():
        forward, _ = best_of(args.repeats, lambda: loaded.model(**plain_corrupted))
        loop_time, loop = best_of(
            args.repeats,
            lambda: plain_loop(loaded, plain, plain_corrupted, group.answer, group.wrong, layers),
        )
    all_patches, _ = grid_patches(loaded.num_layers, loaded.num_heads, group.tokens, "head")
    chosen = [p for p in all_patches if p.layer in layers]

    def ours(skip_shared_prefix: bool) -> np.ndarray:
        with torch.no_grad():
            runs = patching.run_group(loaded, group)
            found = patching.exact_patching(
                loaded,
                group,
                runs,
                chosen,
                patches_per_pass=args.patches_per_pass,
                skip_shared_prefix=skip_shared_prefix,
            )
            return found.numpy().reshape(loop.shape)

    ours_time, found = best_of(args.repeats, lambda: ours(True))
    difference = np.abs(np.asarray(found) - loop).max()
    if args.every_position:
        every_time, every = best_of(args.repeats, lambda: ours(False))
        every_difference = np.abs(np.asarray(every) - loop).max()
    attribution_time, study = best_of(args.repeats, lambda: patch(loaded, pairs, method="attribution"))
    estimated = study.attribution
    study.attribution = PatchingResult(
        "attribution",
        "denoising",
        "head",
        estimated.ld_clean,
        estimated.ld_corrupted,
        estimated.ld_patched[layers],
    )
    study.exact = PatchingResult(
        "exact",
        "denoising",
        "head",
        estimated.ld_clean,
        estimated.ld_corrupted,
        loop,
    )
    agreement = study.agreement()
    heads = len(layers) * loaded.num_heads
    print("(wall s / CPU s)")
    print(f"plain forward pass (corrupted, full logits): {forward[0]:.2f} / {forward[1]:.2f} s")
    print(f"exact, plain loop of {heads} hooked forward passes: {loop_time[0]:.1f} / {loop_time[1]:.1f} s")
    ratio = ours_time / loop_time
    print(
        f"exact, patch(): {ours_time[0]:.1f} / {ours_time[1]:.1f} s  ratio {ratio[0]:.3f} / {ratio[1]:.3f} "
        f"(target <= 0.333); max |LD difference| {difference:.2e}"
    )
    if args.every_position:
        ratio = every_time / loop_time
        print(
            f"exact, patch() at every position: {every_time[0]:.1f} / {every_time[1]:.1f} s  ratio "
            f"{ratio[0]:.3f} / {ratio[1]:.3f}; max |LD difference| {every_difference:.2e}; the shared start "
            f"skipped takes {ours_time[0] / every_time[0]:.3f} / {ours_time[1] / every_time[1]:.3f} of it"
        )
    passes = attribution_time / forward
    print(
        f"attribution, patch(method='attribution'): {attribution_time[0]:.2f} / {attribution_time[1]:.2f} s "
        f"= {passes[0]:.2f} / {passes[1]:.2f} plain forward passes (target <= 3)"
    )
    print(
        f"attribution vs exact on {heads} heads: Pearson {agreement['pearson']:.3f}, top-"
        f"{agreement['top_k']} agreement {agreement['top_k_agreement']:.2f}"
    )
    order = np.argsort(-np.abs(study.exact.effect), axis=None)[:10]
    for index in order:
        row, head = np.unravel_index(index, study.exact.effect.shape)
        print(
            f"  head {layers[row]}.{head}: exact {study.exact.effect[row, head]:+.3f}, "
            f"attribution {study.attribution.effect[row, head]:+.3f}"
        )


if __name__ == "__main__":
    main()

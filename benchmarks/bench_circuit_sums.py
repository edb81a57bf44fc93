"""Benchmark the two choices of a circuit's masked pass when it sums a layer's absent edges
(``bertology.interventions.circuit_sums``): where the weights are few, a sparse product against a dense
one (:data:`SPARSE_BELOW`), and where they are dense, several layers' columns in one product
(:data:`BLOCK_LAYERS`).

Shapes as smollm2-135m's on the 18 IOI pairs: 301 forward nodes' differences of 18 x 14 x 576 floats, 16
backward nodes per layer. Prints CPU milliseconds per product (``time.process_time``, the median of
``--repeats``) and multiply-adds per second; torch runs ``--threads`` threads (default 1).

Run: ``python benchmarks/bench_circuit_sums.py [--repeats 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bertology.interventions.circuit_sums import weighted_sum

ROWS, WIDTH, COLUMNS = 301, 18 * 14 * 576, 16


def cpu_ms(work: Callable[[], object], repeats: int) -> float:
    """Median CPU milliseconds of ``work`` over ``repeats`` calls (after one warm-up call)."""
    work()
    spent = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        spent.append((time.process_time() - start) * 1000)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(ROWS, WIDTH, generator=generator)
    print(f"{COLUMNS} columns x {ROWS} rows x {WIDTH} floats")
    print("share of non-zero weights | dense ms | sparse ms")
    for share in (0.02, 0.05, 0.1, 0.15, 0.2, 0.35, 0.5):
        weights = (torch.rand(COLUMNS, ROWS, generator=generator) < share).float()
        dense = cpu_ms(lambda weights=weights: weights @ rows, args.repeats)
        sparse = cpu_ms(lambda weights=weights: torch.sparse.mm(weights.to_sparse(), rows), args.repeats)
        print(f"{share:.2f} | {dense:.1f} | {sparse:.1f}")
    print("layers in one dense product | ms per layer | GMAC/s")
    for layers in (1, 2, 3, 4):
        weights = (torch.rand(COLUMNS * layers, ROWS, generator=generator) < 0.5).float()
        spent = cpu_ms(lambda weights=weights: weighted_sum(weights, rows), args.repeats)
        rate = COLUMNS * layers * ROWS * WIDTH / spent / 1e6
        print(f"{layers} | {spent / layers:.1f} | {rate:.1f}")


if __name__ == "__main__":
    main()

"""A grouping genetic algorithm that seats a burst of jobs on nodes together (Liquid).

Falkenauer's grouping GA for bin packing, as Liquid's batch mode uses it: a solution is
the group of jobs each node gets; crossover injects some of one parent's groups into the
other and seats again, first fit, the jobs that displaced; mutation empties a few groups
and seats their jobs again in another order. Fitness: GPUs seated first, then the sum
over nodes of (GPUs in use after / GPUs of the node)² — the burst concentrated on nodes
already busy, whole nodes kept free for the gangs that need them.

The first member is first fit in the jobs' own order over the nodes in the caller's
order (fullest first: what placing them one by one gives), so the answer is never
worse than that by the fitness.
Deterministic for a seed, and bounded by generations rather than by a clock: a plan
reads no clock, and a replay gives the same placements on any machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from schedd.policy.immutable import immutable

UNSEATED = -1


@immutable
class Bin:
    node_id: str
    size: int  # GPUs of the node
    free: int  # GPUs free before the burst


@immutable
class Budget:
    generations: int = 20
    population: int = 8
    stall: int = 5  # generations without a better best before stopping


DEFAULT_BUDGET = Budget()


class _Packing:
    """Items (GPU counts) over bins; `where[i]` is item i's bin or UNSEATED."""

    __slots__ = ("bins", "items", "left", "where")

    def __init__(self, items: Sequence[int], bins: Sequence[Bin]) -> None:
        self.items = items
        self.bins = bins
        self.where = [UNSEATED] * len(items)
        self.left = [b.free for b in bins]

    def copy(self) -> _Packing:
        twin = _Packing.__new__(_Packing)
        twin.items, twin.bins = self.items, self.bins
        twin.where, twin.left = list(self.where), list(self.left)
        return twin

    def seat(self, item: int, b: int) -> None:
        self.where[item] = b
        self.left[b] -= self.items[item]

    def unseat(self, item: int) -> None:
        b = self.where[item]
        if b != UNSEATED:
            self.left[b] += self.items[item]
            self.where[item] = UNSEATED

    def first_fit(self, items: Sequence[int], bin_order: Sequence[int]) -> None:
        for item in items:
            need = self.items[item]
            for b in bin_order:
                if self.left[b] >= need:
                    self.seat(item, b)
                    break

    def fitness(self) -> tuple[int, float]:
        seated = sum(n for n, b in zip(self.items, self.where, strict=True) if b != UNSEATED)
        fill = 0.0
        for bin_, left in zip(self.bins, self.left, strict=True):
            if left != bin_.free:  # untouched bins add the same to every solution
                fill += ((bin_.size - left) / bin_.size) ** 2 - (
                    (bin_.size - bin_.free) / bin_.size
                ) ** 2
        return seated, fill


def pack(
    items: Sequence[tuple[str, int]],
    bins: Sequence[Bin],
    seed: int,
    budget: Budget = DEFAULT_BUDGET,
) -> dict[str, str]:
    """Job id -> node id for the jobs the best packing found seats (the rest: absent).
    `bins` in the order first fit tries them (the caller's best fit)."""
    if not items or not bins:
        return {}
    sizes = [gpus for _, gpus in items]
    rng = random.Random(seed)
    bin_order = list(range(len(bins)))
    first = _Packing(sizes, bins)
    first.first_fit(range(len(sizes)), bin_order)
    population = [first]
    for _ in range(budget.population - 1):
        member = _Packing(sizes, bins)
        order = list(range(len(sizes)))
        rng.shuffle(order)
        member.first_fit(order, bin_order)
        population.append(member)
    scores = [m.fitness() for m in population]
    best = max(range(len(population)), key=lambda i: scores[i])
    stalled = 0
    for _ in range(budget.generations):
        children = [population[best]]  # the best so far always survives
        while len(children) < budget.population:
            a = _tournament(rng, scores)
            b = _tournament(rng, scores)
            child = _crossover(population[a], population[b], rng, bin_order)
            _mutate(child, rng, bin_order)
            children.append(child)
        population = children
        scores = [m.fitness() for m in population]
        top = max(range(len(population)), key=lambda i: scores[i])
        if scores[top] > scores[0]:
            stalled = 0
        else:
            stalled += 1
            if stalled >= budget.stall:
                break
        best = top
    winner = population[best]
    return {
        job_id: bins[b].node_id
        for (job_id, _), b in zip(items, winner.where, strict=True)
        if b != UNSEATED
    }


def _tournament(rng: random.Random, scores: list[tuple[int, float]]) -> int:
    a, b = rng.randrange(len(scores)), rng.randrange(len(scores))
    return a if scores[a] >= scores[b] else b


def _crossover(
    mother: _Packing, father: _Packing, rng: random.Random, bin_order: Sequence[int]
) -> _Packing:
    """The mother with some of the father's groups injected, the displaced seated again."""
    child = mother.copy()
    used = sorted({b for b in father.where if b != UNSEATED})
    if not used:
        return child
    chosen = set(rng.sample(used, rng.randint(1, max(1, len(used) // 2))))
    displaced = [i for i, b in enumerate(child.where) if b in chosen]
    for item in displaced:
        child.unseat(item)
    for item, b in enumerate(father.where):
        if b in chosen:
            child.unseat(item)  # it moves into the injected group
            child.seat(item, b)
    homeless = sorted(
        (i for i in displaced if child.where[i] == UNSEATED), key=lambda i: -child.items[i]
    )
    child.first_fit(homeless, bin_order)
    return child


def _mutate(packing: _Packing, rng: random.Random, bin_order: Sequence[int]) -> None:
    """Empty one or two groups and seat their jobs again, in a shuffled order, with the
    emptied nodes tried last (else first fit puts them straight back)."""
    used = sorted({b for b in packing.where if b != UNSEATED})
    if not used:
        return
    emptied = set(rng.sample(used, min(len(used), rng.randint(1, 2))))
    moved = [i for i, b in enumerate(packing.where) if b in emptied]
    for item in moved:
        packing.unseat(item)
    rng.shuffle(moved)
    order = [b for b in bin_order if b not in emptied] + [b for b in bin_order if b in emptied]
    packing.first_fit(moved, order)

"""Retrieval-augmented prompts: a shared instruction, `docs_per_query` documents from a shared pool in the
order the retriever ranked them (so the same documents come in varying order), then a unique question.

Documents are `doc_blocks` blocks each; their popularity is Zipf (exponent `zipf_s`) over `pool` documents, and
each query draws distinct documents by popularity and shuffles them (a retriever's ranking differs per query).
Arrivals are Poisson at `rps`.
"""

from __future__ import annotations

import random

from benchmarks.workloads import HashIds, Row, row


def rag(seed: int = 0, *, requests: int = 80, pool: int = 24, docs_per_query: int = 3, doc_blocks: int = 4,
        instruction_blocks: int = 1, question_blocks: int = 1, zipf_s: float = 1.1, output_tokens: int = 24,
        rps: float = 1.0) -> list[Row]:
    rng = random.Random(seed)
    ids = HashIds()
    instruction = ids.take(instruction_blocks)
    documents = [ids.take(doc_blocks) for _ in range(pool)]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(pool)]
    rows: list[Row] = []
    at = 0.0
    for _ in range(requests):
        at += rng.expovariate(rps)
        chosen: list[int] = []
        while len(chosen) < docs_per_query:
            doc = rng.choices(range(pool), weights)[0]
            if doc not in chosen:
                chosen.append(doc)
        rng.shuffle(chosen)
        prompt = instruction + [block for doc in chosen for block in documents[doc]] + ids.take(question_blocks)
        rows.append(row(at, prompt, output_tokens))
    return rows

"""The shipped demo corpus mixes its 11 novels: val and every stretch of the demo's training draw on many.

Split in book order, val was the opening of Pride and Prejudice and the demo's 80 steps read the rest of
that novel and then Sherlock Holmes, so val loss rose over the second half of every demo run. These
tests tell each document's book by names and words found in that book alone, so they check the shipped
shards themselves, without the source text.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from speedrun.data.documents import DocumentLoader
from speedrun.data.paths import demo_data_dir, resolve_files
from speedrun.recipes.presets import demo
from speedrun.data.shards import read_shard
from speedrun.train.stages import step_plan
from speedrun.data.tokenizer import EOT, decode

# Names and words of one book each: in the source's 684 documents of ~8 KB, the book with the most hits
# is the document's own for 649, 32 have no hit, and 3 go astray (whales in Walton's letters in
# Frankenstein, a queen in Dorian Gray).
MARKERS = {
    "Pride and Prejudice": {"Darcy", "Bennet", "Bingley", "Wickham", "Longbourn"},
    "The Adventures of Sherlock Holmes": {"Holmes", "Lestrade"},
    "Alice's Adventures in Wonderland": {"Alice", "Rabbit", "Hatter", "Gryphon", "Queen", "Turtle"},
    "Frankenstein": {"Clerval", "Justine", "Felix", "Frankenstein", "Safie", "daemon"},
    "The Time Machine": {"Weena", "Morlocks", "Morlock", "Eloi", "Traveller", "Psychologist"},
    "The War of the Worlds": {"Martians", "Martian", "Woking", "Horsell"},
    "A Tale of Two Cities": {"Lorry", "Defarge", "Darnay", "Manette", "Carton", "Pross", "Jerry", "Stryver",
                             "Marquis"},
    "Dracula": {"Helsing", "Mina", "Lucy", "Harker", "Seward", "Jonathan", "Renfield"},
    "The Picture of Dorian Gray": {"Dorian", "Basil", "Sibyl", "Hallward"},
    "The Adventures of Tom Sawyer": {"Tom", "Huck", "Becky", "Polly", "Sid"},
    "Moby Dick": {"Ahab", "whale", "Queequeg", "Starbuck", "Stubb", "Pequod"},
}


def book_of(text: str) -> str | None:
    """The book whose markers occur most often in `text`; None if none occurs."""
    words = Counter(re.findall(r"[A-Za-z]+", text))
    hits = {book: sum(words[w] for w in marks) for book, marks in MARKERS.items()}
    best = max(hits, key=hits.get)
    return best if hits[best] else None


def books(tokens: np.ndarray) -> Counter:
    """How many of the EOT-started documents in `tokens` come from each recognised book."""
    starts = np.flatnonzero(tokens == EOT)
    ends = [*starts[1:], tokens.size]
    found = Counter(book_of(decode(tokens[a + 1:b])) for a, b in zip(starts, ends))
    found.pop(None, None)
    return found


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPEEDRUN_HOME", str(tmp_path_factory.mktemp("home")))
        d = demo_data_dir()
    return read_shard(resolve_files(d, "demo_train_*.bin")[0]), read_shard(resolve_files(d, "demo_val_*.bin")[0])


def check_val_mixes_books(val: np.ndarray) -> None:
    whole = books(val)
    # Moby Dick, the longest book, is 21% of all documents; book order gave one book 100%
    assert len(whole) >= 7 and max(whole.values()) <= 0.4 * sum(whole.values()), whole
    read = books(val[:demo().docs.val_tokens + 1])  # what the demo preset validates on
    assert len(read) >= 3, read


def demo_tokens_read(home) -> int:
    """Where in its one training shard the demo preset's loader stands after the run, or -1 if it wraps."""
    cfg = demo()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPEEDRUN_HOME", str(home))
        files = resolve_files(demo_data_dir(), cfg.data.train_pattern)
    loader = DocumentLoader(files, 0, 1, cfg.docs)
    for step in range(cfg.stages.total_steps):
        p = step_plan(cfg.stages, step, cfg.docs)
        loader.next_step(p.local_tokens, p.max_doc_len, p.max_docs)
    return -1 if loader.passes else loader.state_dict()["pos"]


def check_demo_training_mixes_books(train: np.ndarray, seen: int) -> None:
    assert seen > 0, "the demo preset runs out of its corpus and wraps"
    halves = books(train[:seen // 2]), books(train[seen // 2:seen])
    for half in halves:
        assert len(half) >= 6 and max(half.values()) <= sum(half.values()) / 3, halves
    assert len(set(halves[0]) & set(halves[1])) >= 6, halves  # the second half reads the same books


def test_val_documents_come_from_many_books(shards):
    check_val_mixes_books(shards[1])


def test_demo_training_draws_on_many_books_throughout(shards, tmp_path_factory):
    check_demo_training_mixes_books(shards[0], demo_tokens_read(tmp_path_factory.mktemp("home")))

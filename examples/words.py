"""Word count, written with the public API as a user would (Wallaroo's word_count example).

Each message is text; split it into words, key by word, keep a running count per word.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from transforms.api import (
    Application,
    DeltaSink,
    TCPSink,
    computation_multi,
    decoder,
    encoder,
    source,
    state_computation,
)

# Characters stripped from both ends of a line and of each token (Wallaroo's split).
PUNCTUATION = " !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


@dataclass
class TextLine:
    text: str


@decoder(header_length=4, length_fmt=">I", schema=pa.schema([("text", pa.string())]))
def decode_text(payload: bytes) -> TextLine:
    return TextLine(payload.decode("utf-8"))


def split_words(text: str) -> list[str]:
    words = []
    for line in text.splitlines():
        for token in line.lower().strip(PUNCTUATION).split(" "):
            token = token.strip(PUNCTUATION)
            if token:  # Wallaroo kept empty tokens and then crashed on them
                words.append(token)
    return words


@computation_multi("split into words")
def split(line: TextLine) -> list[str]:
    return split_words(line.text)


class WordTotal:
    def __init__(self) -> None:
        self.count = 0


@dataclass
class WordCount:
    word: str
    count: int


@state_computation("count word", state=WordTotal)
def count_word(word: str, total: WordTotal) -> WordCount:
    total.count += 1
    return WordCount(word, total.count)


@encoder
def encode_word_count(wc: WordCount) -> bytes:
    return f"{wc.word} => {wc.count}\n".encode()


UPDATES_SCHEMA = pa.schema([("seq", pa.int64()), ("part", pa.int32()), ("word", pa.string()), ("count", pa.int64())])
TOTALS_SCHEMA = pa.schema([("word", pa.string()), ("count", pa.int64()), ("seq", pa.int64()), ("part", pa.int32())])

word_count = Application(
    "word_count",
    source("text", decoder=decode_text, port=7104)
    .to(split)
    .key_by(lambda word: word)
    .to(count_word)
    .to_sink(
        DeltaSink("word_count_updates", schema=UPDATES_SCHEMA, metadata=("seq", "part")),
        DeltaSink("word_totals", mode="upsert", keys=("word",), schema=TOTALS_SCHEMA, metadata=("seq", "part")),
        TCPSink("word_count_tcp", encode_word_count, optional=True),
    ),
    description="Running count per word of the `text` stream.",
)


app = word_count  # the entry registered by default: examples.words:app

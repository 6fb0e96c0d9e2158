"""The special tokens and the character vocabulary: strings <-> token ids [B, T].

Token layout (docs/vae_spec.md): ids 0 `<pad>`, 1 `<sos>`, 2 `<eos>`, then the vocabulary. A batch is
`tokens [B, T]`: each sequence's tokens, one `<eos>`, then `<pad>` up to T = max_len + 1;
`lengths [B]` counts the non-pad tokens, `<eos>` included. `<sos>` is never stored.

Tokenisation is character level: one character of the string is one token. It is what MOSES's CharRNN
does; it works unchanged for any text, not only SMILES; a sequence of L characters is always L tokens,
so `max_length` in characters is exactly the token budget; and decoding is a plain join, so any token
string the model writes decodes to exactly the characters it chose (a <pad> or <sos> it chose before its
<eos> written out by name: see `Vocabulary.decode`). The price is that two-letter atoms
(`Cl`, `Br`) and bracket atoms (`[nH]`) take several steps, which a recurrent model learns early. The
common regex SMILES tokeniser would shorten these sets' sequences by under 2 % (measured on the rdkit
and MOSES test sets) and cannot tokenise text it does not expect.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jax_scan_rnn import validate

# The one definition of the special tokens: every module (models, metrics, tasks) imports these.
SPECIAL_TOKENS = ("<pad>", "<sos>", "<eos>")
PAD, SOS, EOS = range(len(SPECIAL_TOKENS))
# `Vocabulary.to_json`'s format: a reader refuses another (a newer version's tokenisation would read as this one's).
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Vocabulary:
    """Character-level vocabulary: ids 0..2 are `SPECIAL_TOKENS`, then one character per id.

    Save it with a checkpoint (`to_json` / `from_json`): the ids a model was trained on are fixed by it.
    """

    tokens: tuple[str, ...]  # id -> token; SPECIAL_TOKENS first, then single characters in sorted order

    def __post_init__(self):
        if isinstance(self.tokens, str):
            raise TypeError("tokens: expected a tuple of strings, got a single str")
        tokens = tuple(self.tokens)
        if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise ValueError(f"tokens: expected to start with {SPECIAL_TOKENS}, got {tokens[:3]!r}")
        for ch in tokens[len(SPECIAL_TOKENS) :]:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"tokens: expected single characters after the specials, got {ch!r}")
        duplicated = sorted(ch for ch, count in Counter(tokens).items() if count > 1)
        if duplicated:
            raise ValueError(f"tokens: expected distinct characters, got duplicates {duplicated!r}")
        object.__setattr__(self, "tokens", tokens)

    @classmethod
    def build(cls, sequences: Sequence[str]) -> Vocabulary:
        """Vocabulary of every character in `sequences` (sorted), after the special tokens.

        Build it from all the data you will encode (train, validation and test), or encoding a
        held-out sequence with an unseen character raises.
        """
        chars = set().union(*validate.strings("sequences", sequences))
        return cls(SPECIAL_TOKENS + tuple(sorted(chars)))

    @property
    def size(self) -> int:
        """V: number of ids, specials included (the model's one-hot width)."""
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, sequences: Sequence[str], max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of `sequences`.

        Args:
            sequences: B strings.
            max_len: longest sequence allowed, in characters; None: the longest in `sequences`.

        Returns:
            tokens int32 [B, max_len + 1]: each sequence's ids, one <eos>, then <pad>.
            lengths int32 [B]: characters + 1 (the <eos>).

        Raises:
            ValueError: a sequence longer than max_len, or a character not in the vocabulary (both
                name the sequence).
        """
        sequences = validate.strings("sequences", sequences)
        num_chars = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        max_len = validate.integer("max_len", int(num_chars.max(initial=0)) if max_len is None else max_len, lo=0)
        too_long = np.flatnonzero(num_chars > max_len)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"sequences: expected at most max_len={max_len} characters, got {num_chars[i]} in "
                f"sequence {i} {sequences[i]!r} ({too_long.size} too long)"
            )
        # All characters at once: one code point per character (UTF-32), looked up in a dense table
        # (-1: not in the vocabulary), so 1.6 M MOSES SMILES encode in seconds.
        codes = np.frombuffer("".join(sequences).encode("utf-32-le"), dtype=np.uint32)
        chars = [ord(ch) for ch in self.tokens[len(SPECIAL_TOKENS) :]]
        table = np.full(max(int(codes.max(initial=0)), *chars, 0) + 1, -1, dtype=np.int32)
        table[chars] = np.arange(len(SPECIAL_TOKENS), self.size)
        ids = table[codes]
        if (ids < 0).any():
            position = int(np.argmax(ids < 0))
            i = int(np.searchsorted(np.cumsum(num_chars), position, side="right"))
            char, known = chr(codes[position]), "".join(self.tokens[len(SPECIAL_TOKENS) :])
            # A model trained on Kekulé SMILES (the CLI's default) has no aromatic atoms: say how to write them.
            kekule = ("; it has no aromatic atoms: a model trained on Kekulé SMILES (the CLI's default) reads "
                      "molecules written by jax_scan_rnn.data.smiles.canonical_smiles(s, kekule=True)"
                      if char in "cnosp" and not any(a in known for a in "cnosp") else "")
            raise ValueError(
                f"sequences: character {char!r} of sequence {i} {sequences[i]!r} is not in the vocabulary "
                f"(expected one of {known!r}){kekule}"
            )
        batch = len(sequences)
        tokens = np.full((batch, max_len + 1), PAD, dtype=np.int32)
        tokens[np.arange(max_len + 1) < num_chars[:, None]] = ids  # row-major = concatenation order
        tokens[np.arange(batch), num_chars] = EOS
        return tokens, (num_chars + 1).astype(np.int32)

    def decode(self, tokens) -> list[str]:
        """Strings of `tokens` [B, T] (ints): each row up to its first <eos> (all of it if it has none), one
        character per token. A <pad> or <sos> before that <eos> (a model may sample them) is written out by its
        name, "<pad>" or "<sos>": dropping it would return a string the model did not write, and might score it a
        valid molecule; with it, the string is never valid SMILES ("<" is no SMILES character)."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected a [B, T] array, got shape {tokens.shape}")
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"tokens: expected integer ids, got dtype {tokens.dtype}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.size):
            raise ValueError(
                f"tokens: expected ids in [0, {self.size}), got values in [{tokens.min()}, {tokens.max()}]"
            )
        rows = (itertools.takewhile(lambda t: t != EOS, row) for row in tokens.tolist())
        return ["".join(self.tokens[t] for t in row) for row in rows]  # tokens[PAD] = "<pad>", tokens[SOS] = "<sos>"

    def to_json(self) -> str:
        """JSON text that `from_json` turns back into an equal Vocabulary."""
        return json.dumps({"format": "jax_scan_rnn.Vocabulary", "version": FORMAT_VERSION, "tokens": list(self.tokens)})

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        """The Vocabulary that `to_json` wrote."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(
                f"text: expected the JSON written by Vocabulary.to_json, got {str(text)[:60]!r}"
            ) from err
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise ValueError(f"text: expected a JSON object with a 'tokens' list, got {str(text)[:60]!r}")
        version = data.get("version", FORMAT_VERSION)  # (a run's vocabulary saved before the field: version 1)
        if version != FORMAT_VERSION:  # another tokenisation: its ids would decode to other strings, silently
            raise validate.written_by_another_version(
                "text", f"expected a Vocabulary of format version {FORMAT_VERSION}, got version {version!r}")
        return cls(tuple(data["tokens"]))

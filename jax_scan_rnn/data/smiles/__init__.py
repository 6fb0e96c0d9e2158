"""Molecules as strings: load SMILES (or any text), tokenise them, split them, batch them.

    result = load_sequences("rdkit")                 # 14,734 canonical drug-like SMILES, offline
    vocab = Vocabulary.build(result.sequences)
    train, valid, test = split(result.sequences, (0.8, 0.1, 0.1), seed=0)   # sizes: split_sizes(n, ...)
    tokens, lengths = vocab.encode(train, max_len=DEFAULT_MAX_LENGTH)   # [N, T] int32, [N] int32
    batch_tokens, batch_lengths = batch_at(tokens, lengths, batch_size=128, step=step, seed=0)
    batch_tokens = trim(*batch_at(tokens, lengths, 128, step, pool=100))   # similar lengths, less padding
    vocab.decode(batch_tokens)                       # -> list[str]

`sources` reads and cleans the data, `vocabulary` holds the special tokens (`PAD, SOS, EOS`, their one
definition) and maps characters to ids, `batches` splits and batches. Importing this package does not
import rdkit (an optional extra).
"""

from jax_scan_rnn.data.smiles.batches import batch_at, min_split_size, split, split_sizes, trim
from jax_scan_rnn.data.smiles.sources import (
    DEFAULT_MAX_LENGTH,
    DRUG_LIKE,
    RDKIT_FILES,
    LoadResult,
    MoleculeFilter,
    canonical_smiles,
    comma_separated,
    file_fields,
    is_builtin_source,
    kekule_forms,
    load_sequences,
    moses_split,
    names_first,
    parse_smiles,
    randomized_smiles,
    silence_rdkit,
)
from jax_scan_rnn.data.smiles.vocabulary import EOS, PAD, SOS, SPECIAL_TOKENS, Vocabulary

__all__ = [
    "DEFAULT_MAX_LENGTH", "DRUG_LIKE", "EOS", "PAD", "RDKIT_FILES", "SOS", "SPECIAL_TOKENS", "LoadResult",
    "MoleculeFilter", "Vocabulary", "batch_at", "canonical_smiles", "comma_separated", "file_fields",
    "is_builtin_source", "kekule_forms", "load_sequences", "min_split_size", "moses_split", "names_first",
    "parse_smiles", "randomized_smiles", "silence_rdkit", "split", "split_sizes", "trim",
]

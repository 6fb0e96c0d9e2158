"""Train, sample and evaluate the SMILES sequence VAE (`jsr.SeqVAE`, docs/vae_spec.md).

    task = VAETask(decoding="scheduled")            # default "teacher": teacher forcing alone
    cfg = command_config(TRAIN_DEFAULTS)             # `train vae`'s TrainConfig (jax_scan_rnn.train)
    model, dataset, history = train(task, cfg, out_dir="runs/vae")
    report = evaluate(model, dataset, task)           # reconstruction, prior samples, KL, interpolation
    model, vocab, task = load("runs/vae")             # a saved run; dataset = load_dataset(task) reads its data
    task, cfg = PRESETS["moses"].configs(steps=3000)  # MOSES's VAE and data (`train vae --preset moses`)

Every random choice of a training step (the reparameterisation noise, the scheduled-sampling coins,
Gumbel noise) is drawn inside the jitted step from per-sequence keys that are a function of the step
index: the batch is a pure function of the step, so resumed runs are exact and the batch splits over
devices like any other array.
"""
from __future__ import annotations

import inspect
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import metrics, validate
from jax_scan_rnn.compiled import jit
# The task's options and presets, JAX-free (the CLI builds `train vae`'s flags from them before importing JAX); their
# names stay readable from here too, where the recipe's users find them (`X as X`: a re-export to strict checkers).
from jax_scan_rnn.configs.vae import (
    DECODINGS as DECODINGS, ENCODER_ONLY as ENCODER_ONLY, KL_SCHEDULES as KL_SCHEDULES, LEARNING_RATE as LEARNING_RATE,
    MIN_TEST as MIN_TEST, MOSES_EPOCH_UPDATES as MOSES_EPOCH_UPDATES, MOSES_UPDATES as MOSES_UPDATES,
    PRESETS as PRESETS, RECON_REDUCTIONS as RECON_REDUCTIONS, SAVED_BEFORE as SAVED_BEFORE,
    SCHEDULED_ONLY as SCHEDULED_ONLY, SS_MODES as SS_MODES, TRAIN_DEFAULTS as TRAIN_DEFAULTS, Preset as Preset,
    VAETask as VAETask)
from jax_scan_rnn.data import smiles
from jax_scan_rnn.train import TrainConfig, fit, restore_model
from jax_scan_rnn.vae import SeqVAE, check_tokens

SPLIT_FRACTIONS = (0.9, 0.05, 0.05)  # train / validation / test parts of the data (`smiles.split`)
MIN_VALID = 1  # validation sequences a run needs: the periodic evaluation reconstructs them
# Validation sequences of the periodic evaluation during training (the progress bar's "eval" figures): the
# loss on EVAL_LOSS of them, free-running reconstruction of EVAL_RECONSTRUCT. The final report uses the test set.
EVAL_LOSS, EVAL_RECONSTRUCT = 512, 256


@dataclass(frozen=True)
class Dataset:
    vocab: smiles.Vocabulary
    train: list[str]
    valid: list[str]
    test: list[str]
    skipped: dict[str, int]
    # Every way each training molecule may be written ([canonical, randomized...], `VAETask.augment`), or None.
    train_variants: list[list[str]] | None = None
    # The training molecules' canonical SMILES where loading computed them (`--kekule`); see `canonical_train`.
    loaded_canonical: frozenset[str] | None = None
    limit_reached: bool = False  # reading stopped at `VAETask.limit` usable sequences and the data holds more

    @cached_property
    def digest(self) -> str:
        """sha256 of the train, validation and test molecules in order: saved with a run, so that `--resume` on data
        that changed since (a revised file) is named rather than trained on silently. Computed once."""
        import hashlib

        text = "\0".join("\n".join(part) for part in (self.train, self.valid, self.test))
        return hashlib.sha256(text.encode()).hexdigest()

    @cached_property
    def canonical_train(self) -> frozenset[str]:
        """Novelty's reference: the training molecules' canonical SMILES, computed once (rdkit parses every one:
        ~3.5 s for rdkit's 13k molecules) unless loading already did."""
        if self.loaded_canonical is not None:
            return self.loaded_canonical
        return frozenset(metrics.valid_canonical(self.train))


def describe_skipped(skipped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in skipped.items()) or "none"


def min_sequences(batch_size: int) -> int:
    """Fewest usable sequences a run needs: the `SPLIT_FRACTIONS` split must leave one training batch,
    `MIN_VALID` validation and `MIN_TEST` test sequences (for that many and for any more)."""
    return smiles.min_split_size(SPLIT_FRACTIONS, (batch_size, MIN_VALID, MIN_TEST))


def load_dataset(task: VAETask, vocab: smiles.Vocabulary | None = None, *,
                 cache: str | os.PathLike | None = None) -> Dataset:
    """Load, split (train/valid/test = `SPLIT_FRACTIONS`, 90/5/5) and build the vocabulary from the training part
    (or take `vocab`, a model's own: then training molecules with characters outside it are dropped too).

    A data file is parsed as SMILES with rdkit (the "rdkit" source's code), its invalid lines skipped and
    counted as "unparsable", and kept as written (not canonicalised), each molecule once: a line whose molecule
    (canonical SMILES) an earlier line holds, however written, is a "duplicate", so that no molecule is in two
    parts of the split; with `task.smiles_check=False` only the length, repeated-line and character checks apply.
    With `task.writes_kekule`, every molecule is then rewritten as rdkit's canonical SMILES in Kekulé form.
    `max_length` applies to the form the model learns, after that rewrite ("too_long"); `limit` counts the distinct
    molecules read before it (one whose Kekulé form is then too long is not replaced). Raises ValueError, naming `--data`, when the data holds fewer usable sequences than
    `min_sequences(task.batch_size)`, or when too few validation/test sequences remain once those with characters
    unseen in the training part are dropped: nothing is trained on data that cannot be evaluated. `cache`: a folder
    that keeps the Kekulé forms for the next load of the same molecules (`smiles.kekule_forms`; the CLI's).
    """
    file_smiles = None if smiles.is_builtin_source(task.data) else task.smiles_check
    # The length limit applies to the strings the model learns: with the Kekulé rewrite, to its forms, below (a file
    # written with explicit hydrogens is several times longer than its molecules' Kekulé forms). Repeats go in the
    # loader, so that --limit counts distinct molecules (a file writing each twice gave half of them).
    rewrite = task.writes_kekule
    try:
        loaded = smiles.load_sequences(task.data, max_length=None if rewrite else task.max_length, limit=task.limit,
                                       smiles=file_smiles, canonicalize=False if file_smiles else None)
    except (FileNotFoundError, ValueError) as err:
        if not str(err).startswith("source: "):  # a missing file, MOSES's data not installed, a table without a
            raise  # SMILES column: the library names `source`, the user knows --data
        raise type(err)(f"--data {task.data}: {str(err).removeprefix('source: ')}") from None
    sequences, skipped = loaded.sequences, dict(loaded.skipped)
    canonical_of = None  # Kekulé form -> canonical SMILES, for novelty (one parse gives both)
    if rewrite:  # every part in one form: the test set is reconstructed as the model learnt to write
        forms = smiles.kekule_forms(sequences, cache=cache)
        valid = [f for f in forms if f is not None]
        short = [(k, c) for k, c in valid if len(k) <= task.max_length]
        canonical_of = dict(short)
        sequences = list(canonical_of)  # dict order: the data's order, which the seeded split then shuffles
        for reason, count in (("unparsable", len(forms) - len(valid)),
                              ("too_long", len(valid) - len(short)),
                              ("duplicate", len(short) - len(sequences))):
            if count:
                skipped[reason] = skipped.get(reason, 0) + count
    usable = len(sequences)
    read_skipped = describe_skipped(skipped)  # what reading skipped (unseen characters are counted apart below)

    def skipped_text() -> str:  # for a refusal only: it may read the file again
        text = read_skipped
        if not (file_smiles and loaded.skipped.get("unparsable")):
            return text
        if smiles.names_first(task.data):  # `mol1 CCO`: --no-smiles-check would train on whole lines, names too
            return text + ("; most unparsable lines have a SMILES second: the SMILES must be each line's first field "
                           "(SMILES, then an optional name)")
        if smiles.comma_separated(task.data):  # `CCO,mol1`: --no-smiles-check would train on whole lines, names too
            return text + ("; most lines hold commas, as a table does: a comma-separated table is read by its "
                           "header's 'smiles' column when its name ends in .csv")
        return text + "; if the file is not SMILES, pass --no-smiles-check"

    if usable == 0:
        raise ValueError(f"--data {task.data}: holds no usable sequence (skipped: {skipped_text()})")
    needed = min_sequences(task.batch_size)
    if usable < needed:
        percent = "/".join(f"{100 * f:g}" for f in SPLIT_FRACTIONS)
        limited = f" (--limit {task.limit})" if loaded.limit_reached else ""
        raise ValueError(
            f"--data {task.data}: holds {usable} usable sequence{'s' if usable > 1 else ''}{limited}, needs at least "
            f"{needed}: the {percent} % train/valid/test split must leave one training batch (--batch-size "
            f"{task.batch_size}), {MIN_VALID} validation and {MIN_TEST} test sequences (skipped: {skipped_text()})"
        )
    train_seqs, valid_seqs, test_seqs = smiles.split(sequences, SPLIT_FRACTIONS, seed=task.split_seed)
    variants = None
    if task.augment:
        variants = [[s, *(v for v in smiles.randomized_smiles(s, task.augment, i, task.max_length, task.writes_kekule)
                          if v != s)] for i, s in enumerate(train_seqs)]
    dropped_train, given = 0, vocab is not None
    if not given:
        vocab = smiles.Vocabulary.build([v for vs in variants for v in vs] if variants else train_seqs)
    known = set(vocab.tokens)
    if given:  # a molecule the given vocabulary cannot write is dropped, a way of writing one (augment) too
        kept = [i for i, s in enumerate(train_seqs) if set(s) <= known]
        dropped_train = len(train_seqs) - len(kept)
        train_seqs = [train_seqs[i] for i in kept]
        if variants:
            variants = [[v for v in variants[i] if set(v) <= known] for i in kept]
        if len(train_seqs) < task.batch_size:
            raise ValueError(
                f"--data {task.data}: {len(train_seqs)} training sequences remain once those with characters outside "
                f"the model's vocabulary are dropped ({dropped_train}); needs at least one batch (--batch-size "
                f"{task.batch_size})")

    # Validation/test sequences with characters unseen in training cannot be encoded: drop and count them.
    def encodable(seqs):
        kept = [s for s in seqs if set(s) <= known]
        return kept, len(seqs) - len(kept)

    valid_seqs, dropped_v = encodable(valid_seqs)
    test_seqs, dropped_t = encodable(test_seqs)
    if dropped_train + dropped_v + dropped_t:
        skipped["unseen_character"] = dropped_train + dropped_v + dropped_t
    if len(valid_seqs) < MIN_VALID or len(test_seqs) < MIN_TEST:
        raise ValueError(
            f"--data {task.data}: of its {usable} usable sequences, {len(valid_seqs)} validation and "
            f"{len(test_seqs)} test sequences remain once those with characters absent from the training part are "
            f"dropped (unseen_character {dropped_train + dropped_v + dropped_t}); needs at least {MIN_VALID} validation "
            f"and {MIN_TEST} test sequences (skipped: {skipped_text()})"
        )
    loaded_canonical = None if canonical_of is None else frozenset(canonical_of[s] for s in train_seqs)
    return Dataset(vocab, train_seqs, valid_seqs, test_seqs, skipped, variants, loaded_canonical,
                   loaded.limit_reached)


def model_arguments(task: VAETask, vocab_size: int) -> dict[str, Any]:
    """The model's constructor arguments, the same for `SeqVAE` and `torch_ref.SeqVAE` (the decoder's sizes
    resolved: None means the encoder's)."""
    return {"vocab_size": vocab_size, "hidden_size": task.hidden_size, "latent_size": task.latent_size,
            "num_layers": task.num_layers,
            "decoder_hidden_size": task.hidden_size if task.decoder_hidden_size is None else task.decoder_hidden_size,
            "decoder_layers": task.num_layers if task.decoder_layers is None else task.decoder_layers,
            "bidirectional": task.bidirectional, "concat_z": task.concat_z}


def build_model(task: VAETask, vocab_size: int, seed: int = 0) -> SeqVAE:
    return SeqVAE(**model_arguments(task, vocab_size), rngs=nnx.Rngs(seed))


@dataclass(frozen=True)
class InitFrom:
    """A `torch_ref.SeqVAE` to start training from (`--init-from FILE`): its state_dict, and the vocabulary its
    token ids index, from the side file FILE.json that `export vae` writes beside it."""

    path: Path
    state_dict: Mapping[str, Any]
    vocab: smiles.Vocabulary
    arguments: dict[str, Any]
    kekule: bool | None = None  # whether its model learnt molecules in Kekulé form (None: the side file does not say)

    @classmethod
    def read(cls, path: str | Path) -> InitFrom:
        """Raises FileNotFoundError or ValueError naming `init_from` and the file."""
        import json

        from jax_scan_rnn.convert import read_state_dict_file, side_file

        path = Path(path)
        state_dict = read_state_dict_file(path, "init_from")
        side = side_file(path)
        if not side.is_file():
            raise FileNotFoundError(f"init_from: no {side} beside {path}: the model's arguments and vocabulary, "
                                    "as `jax-scan-rnn export vae` writes them")
        try:
            data = json.loads(side.read_text(encoding="utf-8-sig"))
            vocab = smiles.Vocabulary.from_json(json.dumps(data["vocabulary"]))
            arguments = dict(data["arguments"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"init_from: {side} is not the side file `export vae` writes "
                             f"({type(err).__name__}: {err})") from None
        kekule = data.get("kekule")
        return cls(path, state_dict, vocab, arguments, kekule if isinstance(kekule, bool) else None)

    def check(self, task: VAETask) -> None:
        """The file's model must be the one `task` builds: each size that differs is named with its value. The side
        file's arguments are read as `torch_ref.SeqVAE` reads them (a side file written by hand may leave out one
        with a default, or give the decoder's sizes as None: the encoder's)."""
        wanted = model_arguments(task, self.vocab.size)
        given = {name: p.default for name, p in inspect.signature(SeqVAE.__init__).parameters.items()
                 if name in wanted and p.default is not inspect.Parameter.empty} | self.arguments
        for decoder, encoder in (("decoder_hidden_size", "hidden_size"), ("decoder_layers", "num_layers")):
            if given.get(decoder) is None:
                given[decoder] = given.get(encoder)
        differ = [k for k in wanted if given.get(k) != wanted[k]]
        if differ:
            raise ValueError(
                f"init_from: {self.path} holds a model with "
                + ", ".join(f"{k}={given.get(k)}" for k in differ) + "; this run's has "
                + ", ".join(f"{k}={wanted[k]}" for k in differ) + ": set them to the file's")
        if self.kekule is not None and self.kekule != task.writes_kekule:
            # Otherwise every molecule written the other way would be dropped as unseen (aromatic c, n, o, s).
            forms = {True: "in Kekulé form", False: "as written (aromatic)"}
            raise ValueError(f"init_from: {self.path} holds a model that learnt molecules {forms[self.kekule]}; this "
                             f"run writes them {forms[task.writes_kekule]}: "
                             + ("leave out --no-kekule" if self.kekule else "pass --no-kekule"))

    def load_into(self, model: SeqVAE) -> dict[str, str]:
        """Its weights into `model`; returns {path, sha256} for the run's metadata."""
        from jax_scan_rnn.convert import load_state_dict_file

        return load_state_dict_file(model, self.state_dict, self.path, "init_from", "the arguments in its side file")


def encode(vocab: smiles.Vocabulary, sequences: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """`vocab.encode(sequences, max_length)`, checked with `check_tokens` while concrete: a jitted model
    cannot check token ids, so nothing reaches one unchecked."""
    tokens, lengths = vocab.encode(sequences, max_length)
    check_tokens(tokens, lengths, vocab.size)
    return tokens, lengths


def make_batch_fn(task: VAETask, dataset: Dataset, seed: int = 0):
    """`step -> batch`, a pure function of the step: tokens, lengths, per-sequence keys and schedules. The
    batch order and the per-step noise are seeded by `task.data_seed + seed` (the run's seed)."""
    data_seed = task.data_seed + seed
    variants = dataset.train_variants or [[s] for s in dataset.train]
    counts = np.array([len(vs) for vs in variants])
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # row of each molecule's first way in `tokens`
    tokens, lengths = encode(dataset.vocab, [v for vs in variants for v in vs], task.max_length)  # checked once
    molecules, canonical_lengths = np.arange(len(variants))[:, None], lengths[first]  # bucketing sorts by these
    width = int(lengths.max())

    def batch_fn(step: int) -> dict:
        # Epochs over molecules (not over their written forms); then one way of writing each, drawn per step.
        rows = smiles.batch_at(molecules, canonical_lengths, task.batch_size, step, seed=data_seed,
                               pool=task.bucket_pool)[0][:, 0]
        picked = first[rows] + np.random.default_rng((data_seed, step, 1)).integers(counts[rows])
        tok, length = tokens[picked], lengths[picked]
        if task.bucket_pool:  # cut to the rows' own longest (the written forms drawn may differ in length)
            tok = smiles.trim(tok, length)
        else:  # one width for every step: the longest training sequence's (the columns cut hold only padding)
            tok = tok[:, :width]
        b = task.batch_size
        return {
            "tokens": tok,
            "lengths": length,
            # One raw threefry key per sequence, a function of (data_seed, step): it shards with the batch.
            "keys": np.random.default_rng((data_seed, step)).integers(0, 2**32, (b, 2), dtype=np.uint32),
            "beta": np.full((b,), task.beta(step), np.float32),
            "p_replace": np.full((b,), task.replacement_probability(step), np.float32),
        }

    return batch_fn


def make_loss_fn(task: VAETask):
    """`(model, batch) -> (total, metrics)`: the ELBO with the task's decoding, noise from the batch keys.

    Per sequence b, key_b splits into three streams: eps [Z]; one uniform coin per token [T], the scheduled-
    sampling coins (replaced where coin < p_replace) or, under teacher decoding, the word-dropout coins (no
    token where coin < word_dropout); Gumbel noise [T, V]. The loss is `model.loss`'s total = recon + beta * kl,
    or with `recon_reduction="token"` recon / n + beta * kl, n = the batch's mean count of scored (non-pad)
    tokens per sequence: MOSES's per-token mean cross-entropy.

    The logged `kl` is the KL itself, `sum(kl_per_dim)`, as the evaluation rows and the final report give it: free
    bits (`task.free_bits`) raise the KL the loss penalises to at least `free_bits` per dimension, and that floor
    logged as `kl` would read as a latent in use when it has collapsed.
    """

    def loss_fn(model: SeqVAE, batch: dict):
        tokens = batch["tokens"]
        steps = tokens.shape[1]
        keys = jax.vmap(jax.random.wrap_key_data)(batch["keys"])
        split = jax.vmap(partial(jax.random.split, num=3))(keys)  # [B, 3]
        eps = jax.vmap(lambda k: jax.random.normal(k, (model.latent_size,)))(split[:, 0])
        coins = jax.vmap(lambda k: jax.random.uniform(k, (steps,)))(split[:, 1])  # [B, T]; unused: compiled away
        kwargs = {}
        if task.decoding == "scheduled":
            kwargs["replace_mask"] = coins < batch["p_replace"][:, None]
            kwargs["mode"] = task.ss_mode
            if task.ss_mode != "argmax":
                kwargs["gumbel"] = jax.vmap(lambda k: jax.random.gumbel(k, (steps, model.vocab_size)))(split[:, 2])
        elif task.word_dropout:  # VAETask allows it with teacher decoding only
            kwargs["word_mask"] = coins < task.word_dropout
        if task.decoder_only:
            kwargs["z"] = jnp.zeros_like(eps)
        beta = batch["beta"][0]
        out = model.loss(tokens, batch["lengths"], beta=beta, free_bits=task.free_bits, eps=eps, **kwargs)
        total = out["total"]
        if task.recon_reduction == "token":
            scored_per_sequence = jnp.sum(tokens != smiles.PAD) / tokens.shape[0]
            total = out["recon"] / scored_per_sequence + beta * out["kl"]
        return total, {"recon": out["recon"], "kl": jnp.sum(out["kl_per_dim"]), "beta": beta,
                       "p_replace": batch["p_replace"][0]}

    return loss_fn


# Every call below goes through `jsr.jit(model)`, which keeps the compiled functions per model: Python
# scalars (max_len, temperature, top_k) are static there, so the model's own checks on them run before jit.
def _encode(model, tokens, lengths):
    return jit(model).encode(tokens, lengths)  # (mu, logvar)


def _greedy(model, z, max_len):
    return jit(model).generate(z, max_len, mode="greedy")


def sample_bytes(task: VAETask, vocab_size: int, n: int) -> int:
    """A bound on the memory `sample` takes for `n` samples of the model `task` builds (float32): the Gumbel
    noise `[n, T, V]` and the tokens `[n, T]` (T = max_length + 1), the latents, and one step's logits and
    decoder state."""
    arguments = model_arguments(task, vocab_size)  # the decoder's sizes resolved
    hidden, layers = arguments["decoder_hidden_size"], arguments["decoder_layers"]
    per_sample = (task.max_length + 1) * (vocab_size + 1) + task.latent_size + 2 * vocab_size + 2 * hidden * layers
    return 4 * n * per_sample


def sample(model: SeqVAE, vocab: smiles.Vocabulary, n: int, *, max_len: int, seed: int = 0, temperature: float = 1.0,
           top_k: int = 0, greedy: bool = False, decoder_only: bool = False, z: np.ndarray | None = None) -> list[str]:
    """`n` SMILES from the prior z ~ N(0, I) (`decoder_only`: from z = 0, a CharRNN), in one jitted call; or, given
    latents `z [N, Z]` (`latents`' mu, say), `n` decoded from each row: N * n SMILES, row 0's n first. Greedy
    decoding has one answer per latent, so it takes `n=1` with `z`.

    `vocab.decode(sample_tokens(...))`: a sample with no <eos> within `max_len` is its `max_len` tokens, scored as
    it is, as MOSES does (`unterminated` counts them); one that wrote <pad> or <sos> before its <eos> holds that
    token's name, never a valid molecule (`Vocabulary.decode`)."""
    return vocab.decode(sample_tokens(model, n, max_len=max_len, seed=seed, temperature=temperature, top_k=top_k,
                                      greedy=greedy, decoder_only=decoder_only, z=z))


def unterminated(tokens: np.ndarray) -> float:
    """Fraction of the rows of sampled `tokens [N, max_len]` with no <eos>: cut at max_len, not finished. MOSES
    scores such a string as it is, so a model whose samples never end may still write "valid" ones (runs of carbon)."""
    return float(np.mean(~np.any(np.asarray(tokens) == smiles.EOS, axis=1)))


def sample_tokens(model: SeqVAE, n: int, *, max_len: int, seed: int = 0, temperature: float = 1.0, top_k: int = 0,
                  greedy: bool = False, decoder_only: bool = False, z: np.ndarray | None = None) -> np.ndarray:
    """The token ids `[N, max_len]` of `sample`'s sequences, before decoding: each up to its first <eos>, <pad>
    after it (`SeqVAE.generate`)."""
    # Python ints: a NumPy one would reach generate's static max_len traced (jsr.jit traces NumPy scalars), and n's
    # errors were JAX's own (n=-1: an MLIRError) or named z (n=0: "z: expected shape [B, Z] = [B, 4], got [0, 4]").
    n = validate.integer("n", n, lo=1)
    max_len = validate.integer("max_len", max_len, lo=1)
    key_z, key_g = jax.random.split(jax.random.key(seed))
    if z is not None:
        if greedy and n > 1:
            raise ValueError(f"n: expected 1 with greedy decoding of given latents (each decodes to one sequence), "
                             f"got {n}")
        given = np.asarray(z)
        if np.issubdtype(given.dtype, np.number) and not np.isfinite(given).all():  # else the model says what it takes
            raise ValueError(f"z: expected finite latents, got {int((~np.isfinite(given)).sum())} NaN or inf values "
                             "(a row holding one decodes to nothing but <pad>, silently)")
        z = jnp.repeat(jnp.asarray(z, model.dtype), n, axis=0)
        n = z.shape[0]
    else:
        z = jax.random.normal(key_z, (n, model.latent_size), model.dtype)
    if decoder_only:
        z = jnp.zeros_like(z)
    if greedy:
        tokens = _greedy(model, z, max_len)
    else:
        gumbel = jax.random.gumbel(key_g, (n, max_len, model.vocab_size), model.dtype)
        tokens = jit(model).generate(z, max_len, mode="sample", temperature=temperature, top_k=top_k, gumbel=gumbel)
    return np.asarray(tokens)


def latents(model: SeqVAE, vocab: smiles.Vocabulary, task: VAETask, sequences: list[str], *,
            cache: str | os.PathLike | None = None) -> dict[str, Any]:
    """The encoder's posterior q(z | x) of each sequence the model can read, in jitted calls of `ENCODE_CHUNK`.

    Each is first written as the run's molecules were: in Kekulé form (`task.writes_kekule`), as rdkit's canonical
    SMILES (the "rdkit" source's molecules, aromatic), else as given, parsed with rdkit unless the run's data is not
    SMILES (`smiles_check=False`). One that rdkit cannot parse, longer than `task.max_length` or with a character
    outside `vocab` is skipped and counted. Returns
    `{"index": [N] positions in `sequences` of those encoded, "sequences": [N] them as encoded, "mu": [N, Z],
    "logvar": [N, Z], "skipped": {reason: count}}`. `cache`: as `load_dataset`'s, for the Kekulé forms."""
    written, skipped = validate.strings("sequences", sequences), Counter()
    if task.writes_kekule:
        written = [form and form[0] for form in smiles.kekule_forms(written, cache=cache)]
    elif task.data == "rdkit":
        written = [smiles.canonical_smiles(s) for s in written]
    elif task.smiles_check:
        with smiles.silence_rdkit():
            written = [s if smiles.parse_smiles(s) is not None else None for s in written]
    known, index, kept = set(vocab.tokens), [], []
    for i, seq in enumerate(written):
        if seq is None:
            skipped["unparsable"] += 1
        elif len(seq) > task.max_length:
            skipped["too_long"] += 1
        elif not set(seq) <= known:
            skipped["unseen_character"] += 1
        else:
            index.append(i)
            kept.append(seq)
    # In chunks: one call over a whole file would hold every molecule's hoisted input projections at once (on a GPU,
    # [N, T, 3H] floats: 300 GB for a million molecules at the default sizes).
    posterior = [_encode(model, *encode(vocab, kept[i:i + ENCODE_CHUNK], task.max_length))
                 for i in range(0, len(kept), ENCODE_CHUNK)]
    empty = np.zeros((0, model.latent_size), np.float32)  # none kept: no call, mu and logvar [0, Z]
    mu, logvar = (np.concatenate([empty, *(np.asarray(p[k], np.float32) for p in posterior)]) for k in (0, 1))
    return {"index": np.asarray(index, np.int64), "sequences": kept, "mu": mu, "logvar": logvar,
            "skipped": dict(skipped)}


ENCODE_CHUNK = 1024  # molecules per encoder call in `latents`: ~0.3 GB of hoisted projections at T=101, H=256


def reconstruction(model: SeqVAE, vocab: smiles.Vocabulary, sequences: list[str], max_length: int) -> dict[str, float]:
    """Token and whole-sequence accuracy decoding from mu, teacher-forced and free-running (greedy)."""
    tokens, lengths = encode(vocab, sequences, max_length)
    mu = _encode(model, tokens, lengths)[0]
    mask = tokens != smiles.PAD
    forced = np.asarray(jnp.argmax(jit(model).decode(mu, tokens), axis=-1))
    free = np.asarray(_greedy(model, mu, tokens.shape[1]))
    return {
        "tf_token_acc": metrics.token_accuracy(forced, tokens, mask),
        "tf_sequence_acc": metrics.sequence_accuracy(forced, tokens, mask),
        "free_token_acc": metrics.token_accuracy(free, tokens, mask),
        "free_sequence_acc": metrics.sequence_accuracy(free, tokens, mask),
    }


def sample_scores(generated: list[str], dataset: Dataset, task: VAETask,
                  tokens: np.ndarray | None = None) -> dict[str, float | None]:
    """`validity`, `uniqueness` and `novelty` of generated sequences: MOSES's, for SMILES. A run on sequences that
    are not SMILES (`smiles_check=False`) has no validity (None: rdkit would call every one invalid); in its place
    `well_formed`, the fraction that are sequences of the data: non-empty and, given the `tokens [N, T]` that
    `generated` was decoded from, with no <pad> or <sos> before their <eos> (decoded by name, "A<pad>B": no string
    of the data, and the reason a SMILES run scores it invalid). Its uniqueness and novelty compare the strings as
    written (distinct ones; novel: not a training one) among the well-formed ones."""
    generated = validate.strings("generated", generated, each=False)  # read by each score: a generator once
    if task.smiles_check:
        return {"validity": metrics.validity(generated),
                "uniqueness": metrics.uniqueness(generated, k=len(generated)),
                "novelty": metrics.novelty(generated, dataset.canonical_train, train_is_canonical=True)}
    formed = np.array([bool(s) for s in generated], dtype=bool)
    if tokens is not None:  # on the ids: the data's own characters may spell "<pad>"
        ids = np.asarray(tokens)
        before_eos = np.cumsum(ids == smiles.EOS, axis=1) == 0
        formed &= ~np.any(before_eos & ((ids == smiles.PAD) | (ids == smiles.SOS)), axis=1)
    sequences = [s for s, ok in zip(generated, formed) if ok]
    distinct = set(sequences)
    return {"validity": None, "well_formed": len(sequences) / len(generated) if generated else float("nan"),
            "uniqueness": len(distinct) / len(sequences) if distinct else float("nan"),
            "novelty": len(distinct - set(dataset.train)) / len(distinct) if distinct else float("nan")}


def evaluate(model: SeqVAE, dataset: Dataset, task: VAETask, *, seed: int = 0) -> dict:
    """Reconstruction of held-out molecules, prior samples' MOSES metrics, KL per dimension, interpolation.

    `report["samples"]` (at temperature 1) and `report["samples_greedy"]`: `n`, `validity`, `unterminated` (the
    fraction with no <eos> within max_length + 1 tokens, scored as cut, as MOSES does: see `unterminated`),
    `uniqueness`, `novelty` (`well_formed` in place of validity without `task.smiles_check`: see `sample_scores`) and the first ten `examples`. Without `task.decoder_only`, `reconstruction`, `latent`
    (`kl`, `kl_per_dim`, `active_units`) and `interpolation` too."""
    model.eval()
    test = dataset.test[: task.eval_sequences]
    report = {}
    if not task.decoder_only:  # a CharRNN has no latent to reconstruct from
        report["reconstruction"] = {**reconstruction(model, dataset.vocab, test, task.max_length), "n": len(test)}
    # The same latents decoded two ways: sampled at temperature 1 (what MOSES reports) and greedily.
    # A decoder that has not yet sharpened its next-token distributions writes far more valid SMILES
    # greedily, so the pair tells an undertrained language model from a latent space off the prior.
    for name, greedy in (("samples", False), ("samples_greedy", True)):
        tokens = sample_tokens(model, task.eval_samples, max_len=task.max_length + 1, seed=seed, greedy=greedy,
                               decoder_only=task.decoder_only)
        generated = dataset.vocab.decode(tokens)
        scores = sample_scores(generated, dataset, task, tokens)
        report[name] = {"n": len(generated), "validity": scores.pop("validity"), "unterminated": unterminated(tokens),
                        **scores, "examples": list(generated[:10])}  # unterminated read beside validity
    if task.decoder_only:
        return report
    tokens, lengths = encode(dataset.vocab, test, task.max_length)
    mu, logvar = (np.asarray(a) for a in _encode(model, tokens, lengths))  # reuses reconstruction's compiled encoder
    kl_per_dim = np.mean(-0.5 * (1 + logvar - mu**2 - np.exp(logvar)), axis=0)
    report["latent"] = {"kl": float(kl_per_dim.sum()), "kl_per_dim": kl_per_dim.round(4).tolist(),
                        "active_units": metrics.kl_active_units(mu)}
    path = metrics.interpolate(mu[0], mu[1], 7).astype(np.asarray(mu).dtype)
    report["interpolation"] = {"from": test[0], "to": test[1],
                               "path": dataset.vocab.decode(np.asarray(_greedy(model, path, task.max_length + 1)))}
    return report


def train(task: VAETask, cfg: TrainConfig, out_dir: str | Path | None = None, *, resume: bool = False, callback=None,
          dataset: Dataset | None = None, init_from: InitFrom | None = None, **fit_kwargs):
    """Train a fresh VAE (or resume `out_dir`); returns `(model, dataset, history)`.

    `init_from`: start from its weights instead of a random initialisation (a resumed run starts from its
    checkpoint); the dataset is then read with its vocabulary (`load_dataset(task, init_from.vocab)`)."""
    if init_from is not None:
        init_from.check(task)
    dataset = load_dataset(task, init_from and init_from.vocab) if dataset is None else dataset
    if init_from is not None and dataset.vocab != init_from.vocab:
        raise ValueError(f"dataset: expected one read with the vocabulary of init_from {init_from.path}, got another")
    seed = cfg.seed  # the run's one seed: initialisation, batch order, per-step noise
    model = build_model(task, dataset.vocab.size, seed)
    metadata = {"model": "vae", "task": task.to_json(), "vocab": dataset.vocab.to_json(), "seed": seed,
                "data_sha256": dataset.digest}
    if init_from is not None:
        metadata["init_from"] = init_from.load_into(model)
    valid_tokens, valid_lengths = encode(dataset.vocab, dataset.valid[:EVAL_LOSS], task.max_length)

    def eval_fn(m: SeqVAE) -> dict[str, float]:
        m.eval()
        zeros = jnp.zeros((len(valid_tokens), m.latent_size), m.dtype)
        if task.decoder_only:
            return {"recon": float(jit(m).loss(valid_tokens, valid_lengths, z=zeros)["recon"])}
        out = jit(m).loss(valid_tokens, valid_lengths, eps=zeros)
        acc = reconstruction(m, dataset.vocab, dataset.valid[:EVAL_RECONSTRUCT], task.max_length)
        return {"recon": float(out["recon"]), "kl": float(out["kl"]), "free_sequence_acc": acc["free_sequence_acc"]}

    history = fit(model, make_loss_fn(task), make_batch_fn(task, dataset, seed), cfg, out_dir=out_dir,
                  eval_fn=eval_fn, resume=resume, callback=callback, metadata=metadata, **fit_kwargs)
    return model, dataset, history


def load(out_dir: str | Path, step: int | None = None) -> tuple[SeqVAE, smiles.Vocabulary, VAETask]:
    """Rebuild a trained VAE (model, vocabulary, task) from its checkpoint."""
    from jax_scan_rnn import checkpoint

    meta = checkpoint.read_metadata(Path(out_dir) / "checkpoints", step)
    if meta.get("model") != "vae":
        raise ValueError(f"out_dir: expected a VAE run, got model {meta.get('model')!r} in {out_dir}")
    task = VAETask.from_json(meta["task"])
    vocab = smiles.Vocabulary.from_json(meta["vocab"])
    model = build_model(task, vocab.size, meta.get("seed", 0))
    restore_model(out_dir, model, step)
    return model, vocab, task

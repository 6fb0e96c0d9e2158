"""Train, sample and evaluate the SMILES sequence VAE (`jsr.SeqVAE`, docs/vae_spec.md).

    task = VAETask(decoding="scheduled")            # default "teacher": teacher forcing alone
    model, vocab, history = train(task, TrainConfig(steps=1200, learning_rate=LEARNING_RATE), out_dir="runs/vae")
    report = evaluate(model, vocab, task)             # reconstruction, prior samples, KL, interpolation

Every random choice of a training step (the reparameterisation noise, the scheduled-sampling coins,
Gumbel noise) is drawn inside the jitted step from per-sequence keys that are a function of the step
index: the batch is a pure function of the step, so resumed runs are exact and the batch splits over
devices like any other array.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import metrics
from jax_scan_rnn import schedules
from jax_scan_rnn.compiled import jit
from jax_scan_rnn.options import check, option
from jax_scan_rnn.data import smiles
from jax_scan_rnn.train import TrainConfig, fit, restore_model
from jax_scan_rnn.vae import SeqVAE, check_tokens

DECODINGS = ("teacher", "scheduled")
# Peak Adam learning rate of `jax-scan-rnn train vae` (and examples/03): the balance of reconstruction and
# prior-sample validity in a sweep, docs/measurements.md#vae-learning-rate.
LEARNING_RATE = 1e-2
SS_MODES = ("argmax", "sample", "gumbel_softmax")
KL_SCHEDULES = ("constant", "linear", "sigmoid")
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)  # train / validation / test parts of the data (`smiles.split`)
MIN_VALID = 1  # validation sequences a run needs: the periodic evaluation reconstructs them
MIN_TEST = 2  # test sequences a run needs: the final report reconstructs them and interpolates between two
# Validation sequences of the periodic evaluation during training (the progress bar's "eval" figures): the
# loss on EVAL_LOSS of them, free-running reconstruction of EVAL_RECONSTRUCT. The final report uses the test set.
EVAL_LOSS, EVAL_RECONSTRUCT = 512, 256


@dataclass(frozen=True)
class VAETask:
    """Data, model size and training objective of a VAE run (every field is a `train vae` flag)."""

    data: str = option("rdkit", "rdkit (SMILES shipped with rdkit), moses (pip install --no-deps molsets) or a text "
                                "file with one sequence per line")
    smiles_check: bool = option(True, "parse a --data file's lines as SMILES (rdkit) and skip invalid ones; "
                                      "--no-smiles-check: the file is not chemistry")
    max_length: int = option(smiles.DEFAULT_MAX_LENGTH, "longer sequences are skipped (counted)", lo=1)
    limit: int | None = option(None, "use at most this many sequences", lo=1)
    augment: int = option(0, "randomized SMILES per training molecule (Arus-Pous et al. 2019): each time a molecule "
                             "is drawn, it is written one of these ways or canonically; 0: off", lo=0)
    hidden_size: int = option(256, "H of the encoder and decoder GRUs", lo=1)
    latent_size: int = option(64, "Z, the latent size", lo=1)
    num_layers: int = option(1, "GRU layers in the encoder and in the decoder", lo=1)
    bidirectional: bool = option(False, "bidirectional encoder")
    concat_z: bool = option(False, "append z to every decoder input (as MOSES does)")
    decoder_only: bool = option(False, "a CharRNN baseline from the same code: the decoder alone, from a fixed zero "
                                       "latent, trained on reconstruction alone (no encoder, no KL)")
    batch_size: int = option(128, "sequences per step", lo=1)
    decoding: str = option("teacher", "teacher forcing only, or scheduled sampling per token (the README says what "
                                      "each does to reconstruction and to sampled molecules)", choices=DECODINGS)
    ss_mode: str = option("argmax", "what replaces a token: the model's argmax, a sample, or straight-through Gumbel",
                          choices=SS_MODES)
    ss_schedule: str = option("inverse_sigmoid", "decay of the teacher-forcing probability",
                              choices=schedules.TEACHER_FORCING_SCHEDULES)
    ss_midpoint: int = option(1000, "step at which the teacher-forcing probability has decayed to 0.5", lo=3)
    ss_max: float = option(0.5, "cap on the replacement probability", lo=0, hi=1)
    kl_schedule: str = option("linear", "KL weight annealing", choices=KL_SCHEDULES)
    kl_warmup: int = option(500, "steps for the KL weight to reach max_beta (sigmoid's midpoint is half of it)", lo=0)
    max_beta: float = option(0.05, "final KL weight (MOSES: 0.05; 1.0 is the ELBO proper, but collapses the latent)",
                             lo=0)
    free_bits: float = option(0.0, "KL free bits per latent dimension (0: off)", lo=0)
    split_seed: int = option(0, "seed of the train/validation/test split", lo=0)
    data_seed: int = option(0, "seed of the batch order and of the per-step noise (added to --seed)", lo=0)
    eval_samples: int = option(1000, "prior samples drawn by the final evaluation", lo=1)
    eval_sequences: int = option(500, "test sequences reconstructed by the final evaluation (it interpolates between "
                                      "two)", lo=MIN_TEST)

    def __post_init__(self):
        check(self)  # every option, before any data is read or any directory written
        if self.augment and not self.smiles_check:
            raise ValueError(f"augment: expected 0 with smiles_check=False (randomized SMILES rewrite molecules; the "
                             f"data is not chemistry), got {self.augment}")
        if not self.smiles_check and smiles.is_builtin_source(self.data):
            raise ValueError(
                f"smiles_check: expected True for the built-in source {self.data!r} (always SMILES; False is "
                "for a data file that is not chemistry), got False"
            )

    def _schedule_params(self) -> dict[str, float]:
        """The Bengio et al. schedule's parameter for which eps_{ss_midpoint} = 0.5."""
        m = self.ss_midpoint
        if self.ss_schedule == "linear":
            return {"k": 1.0, "c": 0.5 / m}
        if self.ss_schedule == "exponential":
            return {"k": 0.5 ** (1.0 / m)}
        k = m / np.log(m)  # inverse sigmoid: eps = 0.5 where i = k ln k; Newton's method on k ln k = m
        for _ in range(50):
            k -= (k * np.log(k) - m) / (np.log(k) + 1.0)
        return {"k": float(max(k, 1.0))}

    def replacement_probability(self, step: int) -> float:
        """Probability that a token is replaced by the model's own prediction at `step` (0 for teacher)."""
        if self.decoding == "teacher":
            return 0.0
        eps = schedules.make_teacher_forcing_schedule(self.ss_schedule, **self._schedule_params())(step)
        return float(min(self.ss_max, float(schedules.replacement_probability(eps))))

    def beta(self, step: int) -> float:
        if self.kl_schedule == "constant":
            return self.max_beta
        if self.kl_schedule == "linear":
            return float(schedules.kl_linear(step, warmup=self.kl_warmup, max_beta=self.max_beta))
        return float(schedules.kl_sigmoid(step, midpoint=self.kl_warmup / 2, steepness=10.0 / self.kl_warmup,
                                          max_beta=self.max_beta))


@dataclass(frozen=True)
class Dataset:
    vocab: smiles.Vocabulary
    train: list[str]
    valid: list[str]
    test: list[str]
    skipped: dict[str, int]
    # Every way each training molecule may be written ([canonical, randomized...], `VAETask.augment`), or None.
    train_variants: list[list[str]] | None = None


def _skipped_text(skipped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in skipped.items()) or "none"


def min_sequences(batch_size: int) -> int:
    """Fewest usable sequences a run needs: the `SPLIT_FRACTIONS` split must leave one training batch,
    `MIN_VALID` validation and `MIN_TEST` test sequences (for that many and for any more)."""
    return smiles.min_split_size(SPLIT_FRACTIONS, (batch_size, MIN_VALID, MIN_TEST))


def load_dataset(task: VAETask) -> Dataset:
    """Load, split (train/valid/test = `SPLIT_FRACTIONS`, 90/5/5) and build the vocabulary from the training part.

    A data file is parsed as SMILES with rdkit (the "rdkit" source's code), its invalid lines skipped and
    counted as "unparsable", and kept as written (not canonicalised); with `task.smiles_check=False` only the
    length and character checks apply. Raises ValueError, naming `--data`, when the data holds fewer usable
    sequences than `min_sequences(task.batch_size)`, or when too few validation/test sequences remain once
    those with characters unseen in the training part are dropped: nothing is trained on data that cannot
    be evaluated.
    """
    file_smiles = None if smiles.is_builtin_source(task.data) else task.smiles_check
    loaded = smiles.load_sequences(task.data, max_length=task.max_length, limit=task.limit, smiles=file_smiles,
                                   canonicalize=False if file_smiles else None)
    usable = len(loaded.sequences)
    skipped_text = _skipped_text(loaded.skipped)
    if file_smiles and loaded.skipped.get("unparsable"):
        skipped_text += "; if the file is not SMILES, pass --no-smiles-check"
    if usable == 0:
        raise ValueError(f"--data {task.data}: holds no usable sequence (skipped: {skipped_text})")
    needed = min_sequences(task.batch_size)
    if usable < needed:
        percent = "/".join(f"{100 * f:g}" for f in SPLIT_FRACTIONS)
        limited = f" (--limit {task.limit})" if task.limit is not None and usable >= task.limit else ""
        raise ValueError(
            f"--data {task.data}: holds {usable} usable sequence{'s' if usable > 1 else ''}{limited}, needs at least "
            f"{needed}: the {percent} % train/valid/test split must leave one training batch (--batch-size "
            f"{task.batch_size}), {MIN_VALID} validation and {MIN_TEST} test sequences (skipped: {skipped_text})"
        )
    train_seqs, valid_seqs, test_seqs = smiles.split(loaded.sequences, SPLIT_FRACTIONS, seed=task.split_seed)
    variants = None
    if task.augment:
        variants = [[s, *(v for v in smiles.randomized_smiles(s, task.augment, i, task.max_length) if v != s)]
                    for i, s in enumerate(train_seqs)]
    vocab = smiles.Vocabulary.build([v for vs in variants for v in vs] if variants else train_seqs)
    # Validation/test sequences with characters unseen in training cannot be encoded: drop and count them.
    def encodable(seqs):
        kept = [s for s in seqs if set(s) <= set(vocab.tokens)]
        return kept, len(seqs) - len(kept)

    valid_seqs, dropped_v = encodable(valid_seqs)
    test_seqs, dropped_t = encodable(test_seqs)
    skipped = dict(loaded.skipped)
    if dropped_v + dropped_t:
        skipped["unseen_character"] = dropped_v + dropped_t
    if len(valid_seqs) < MIN_VALID or len(test_seqs) < MIN_TEST:
        raise ValueError(
            f"--data {task.data}: of its {usable} usable sequences, {len(valid_seqs)} validation and "
            f"{len(test_seqs)} test sequences remain once those with characters absent from the training part are "
            f"dropped (unseen_character {dropped_v + dropped_t}); needs at least {MIN_VALID} validation and "
            f"{MIN_TEST} test sequences (skipped: {skipped_text})"
        )
    return Dataset(vocab, train_seqs, valid_seqs, test_seqs, skipped, variants)


def build_model(task: VAETask, vocab_size: int, seed: int = 0) -> SeqVAE:
    return SeqVAE(vocab_size, task.hidden_size, task.latent_size, task.num_layers, bidirectional=task.bidirectional,
                  concat_z=task.concat_z, rngs=nnx.Rngs(seed))


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
    molecules = np.arange(len(variants))[:, None]

    def batch_fn(step: int) -> dict:
        # Epochs over molecules (not over their written forms); then one way of writing each, drawn per step.
        rows = smiles.batch_at(molecules, counts, task.batch_size, step, seed=data_seed)[0][:, 0]
        picked = first[rows] + np.random.default_rng((data_seed, step, 1)).integers(counts[rows])
        tok, length = tokens[picked], lengths[picked]
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
    """`(model, batch) -> (total, metrics)`: the ELBO with the task's decoding, noise from the batch keys."""

    def loss_fn(model: SeqVAE, batch: dict):
        tokens = batch["tokens"]
        steps = tokens.shape[1]
        keys = jax.vmap(jax.random.wrap_key_data)(batch["keys"])
        split = jax.vmap(partial(jax.random.split, num=3))(keys)  # [B, 3]
        eps = jax.vmap(lambda k: jax.random.normal(k, (model.latent_size,)))(split[:, 0])
        kwargs = {}
        if task.decoding == "scheduled":
            coins = jax.vmap(lambda k: jax.random.uniform(k, (steps,)))(split[:, 1])
            kwargs["replace_mask"] = coins < batch["p_replace"][:, None]
            kwargs["mode"] = task.ss_mode
            if task.ss_mode != "argmax":
                kwargs["gumbel"] = jax.vmap(lambda k: jax.random.gumbel(k, (steps, model.vocab_size)))(split[:, 2])
        if task.decoder_only:
            kwargs["z"] = jnp.zeros_like(eps)
        out = model.loss(tokens, batch["lengths"], beta=batch["beta"][0], free_bits=task.free_bits, eps=eps, **kwargs)
        return out["total"], {"recon": out["recon"], "kl": out["kl"], "beta": batch["beta"][0],
                              "p_replace": batch["p_replace"][0]}

    return loss_fn


# Every call below goes through `jsr.jit(model)`, which keeps the compiled functions per model: Python
# scalars (max_len, temperature, top_k) are static there, so the model's own checks on them run before jit.
def _encode(model, tokens, lengths):
    return jit(model).encode(tokens, lengths)  # (mu, logvar)


def _greedy(model, z, max_len):
    return jit(model).generate(z, max_len, mode="greedy")


def _teacher_forced_argmax(model, z, tokens):
    return jnp.argmax(jit(model).decode(z, tokens), axis=-1)


def sample(model: SeqVAE, vocab: smiles.Vocabulary, n: int, *, max_len: int, seed: int = 0, temperature: float = 1.0,
           top_k: int = 0, greedy: bool = False, decoder_only: bool = False) -> list[str]:
    """`n` SMILES from the prior z ~ N(0, I) (`decoder_only`: from z = 0, a CharRNN), in one jitted call."""
    key_z, key_g = jax.random.split(jax.random.key(seed))
    z = jax.random.normal(key_z, (n, model.latent_size), model.dtype)
    if decoder_only:
        z = jnp.zeros_like(z)
    if greedy:
        tokens = _greedy(model, z, max_len)
    else:
        gumbel = jax.random.gumbel(key_g, (n, max_len, model.vocab_size), model.dtype)
        tokens = jit(model).generate(z, max_len, mode="sample", temperature=temperature, top_k=top_k, gumbel=gumbel)
    return vocab.decode(np.asarray(tokens))


def reconstruction(model: SeqVAE, vocab: smiles.Vocabulary, sequences: list[str], max_length: int) -> dict[str, float]:
    """Token and whole-sequence accuracy decoding from mu, teacher-forced and free-running (greedy)."""
    tokens, lengths = encode(vocab, sequences, max_length)
    mu = _encode(model, tokens, lengths)[0]
    mask = tokens != smiles.PAD
    forced = np.asarray(_teacher_forced_argmax(model, mu, tokens))
    free = np.asarray(_greedy(model, mu, tokens.shape[1]))
    return {
        "tf_token_acc": metrics.token_accuracy(forced, tokens, mask),
        "tf_sequence_acc": metrics.sequence_accuracy(forced, tokens, mask),
        "free_token_acc": metrics.token_accuracy(free, tokens, mask),
        "free_sequence_acc": metrics.sequence_accuracy(free, tokens, mask),
    }


def evaluate(model: SeqVAE, dataset: Dataset, task: VAETask, *, seed: int = 0) -> dict:
    """Reconstruction of held-out molecules, prior samples' MOSES metrics, KL per dimension, interpolation."""
    model.eval()
    test = dataset.test[: task.eval_sequences]
    report = {}
    if not task.decoder_only:  # a CharRNN has no latent to reconstruct from
        report["reconstruction"] = {**reconstruction(model, dataset.vocab, test, task.max_length), "n": len(test)}
    # The same latents decoded two ways: sampled at temperature 1 (what MOSES reports) and greedily.
    # A decoder that has not yet sharpened its next-token distributions writes far more valid SMILES
    # greedily, so the pair tells an undertrained language model from a latent space off the prior.
    for name, greedy in (("samples", False), ("samples_greedy", True)):
        generated = sample(model, dataset.vocab, task.eval_samples, max_len=task.max_length + 1, seed=seed,
                           greedy=greedy, decoder_only=task.decoder_only)
        report[name] = {
            "n": len(generated),
            "validity": metrics.validity(generated),
            "uniqueness": metrics.uniqueness(generated, k=len(generated)),
            "novelty": metrics.novelty(generated, dataset.train),
            "examples": list(generated[:10]),
        }
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
          dataset: Dataset | None = None, **fit_kwargs):
    """Train a fresh VAE (or resume `out_dir`); returns `(model, dataset, history)`."""
    dataset = load_dataset(task) if dataset is None else dataset
    seed = cfg.seed  # the run's one seed: initialisation, batch order, per-step noise
    model = build_model(task, dataset.vocab.size, seed)
    valid_tokens, valid_lengths = encode(dataset.vocab, dataset.valid[:EVAL_LOSS], task.max_length)

    def eval_fn(m: SeqVAE) -> dict[str, float]:
        m.eval()
        zeros = jnp.zeros((len(valid_tokens), m.latent_size), m.dtype)
        if task.decoder_only:
            return {"recon": float(jit(m).loss(valid_tokens, valid_lengths, z=zeros)["recon"])}
        out = jit(m).loss(valid_tokens, valid_lengths, eps=zeros)
        acc = reconstruction(m, dataset.vocab, dataset.valid[:EVAL_RECONSTRUCT], task.max_length)
        return {"recon": float(out["recon"]), "kl": float(out["kl"]), "free_sequence_acc": acc["free_sequence_acc"]}

    history = fit(
        model,
        make_loss_fn(task),
        make_batch_fn(task, dataset, seed),
        cfg,
        out_dir=out_dir,
        eval_fn=eval_fn,
        resume=resume,
        callback=callback,
        metadata={"model": "vae", "task": asdict(task), "vocab": dataset.vocab.to_json(), "seed": seed},
        **fit_kwargs,
    )
    return model, dataset, history


def load(out_dir: str | Path, step: int | None = None) -> tuple[SeqVAE, smiles.Vocabulary, VAETask]:
    """Rebuild a trained VAE (model, vocabulary, task) from its checkpoint."""
    from jax_scan_rnn import checkpoint

    meta = checkpoint.read_metadata(Path(out_dir) / "checkpoints", step)
    if meta.get("model") != "vae":
        raise ValueError(f"checkpoint: expected a VAE run, got model {meta.get('model')!r} in {out_dir}")
    task = VAETask(**meta["task"])
    vocab = smiles.Vocabulary.from_json(meta["vocab"])
    model = build_model(task, vocab.size, meta.get("seed", 0))
    restore_model(out_dir, model, step)
    return model, vocab, task

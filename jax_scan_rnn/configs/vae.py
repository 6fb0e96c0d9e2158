"""`VAETask`: the data, model size and training objective of a VAE run, every field a `train vae` flag, and the
presets of `train vae --preset NAME` (the recipe that trains it: `jax_scan_rnn.tasks.vae`, which re-exports these
names).

JAX-free, as every module of `configs`: the command line is built from these fields before JAX is imported
(`VAETask.replacement_probability` and `beta` import `schedules`, and with it JAX, when called).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from jax_scan_rnn import validate
from jax_scan_rnn.configs.train import TrainConfig, command_config
from jax_scan_rnn.data import smiles
from jax_scan_rnn.options import check, option

TEACHER_FORCING_SCHEDULES = ("linear", "exponential", "inverse_sigmoid")  # schedules.make_teacher_forcing_schedule's
DECODINGS = ("teacher", "scheduled")
RECON_REDUCTIONS = ("sequence", "token")
# Peak Adam learning rate of `jax-scan-rnn train vae` (and examples/03): the balance of reconstruction and
# prior-sample validity in a sweep, docs/measurements.md#vae-learning-rate.
LEARNING_RATE = 1e-2
# `jax-scan-rnn train vae`'s TrainConfig values (the rest are TrainConfig's): the run that writes 90% valid SMILES
# in under 10 minutes of two CPU cores (docs/vae_experiments.md).
TRAIN_DEFAULTS = {"steps": 1800, "learning_rate": LEARNING_RATE, "weight_decay": 0.1}
SS_MODES = ("argmax", "sample", "gumbel_softmax")
KL_SCHEDULES = ("constant", "linear", "sigmoid")
MIN_TEST = 2  # test sequences a run needs: the final report reconstructs them and interpolates between two


# Options with defaults that one setting does not read: typed for it, the CLI refuses them (cli.refuse_unread), or
# notes it for ENCODER_ONLY (a CharRNN baseline shares its VAE's flags).
SCHEDULED_ONLY = ("ss_mode", "ss_schedule", "ss_midpoint", "ss_max")  # read with decoding="scheduled" only
# not read with decoder_only (eval_sequences: the test molecules reconstructed, from their latent)
ENCODER_ONLY = ("bidirectional", "max_beta", "kl_schedule", "kl_warmup", "free_bits", "eval_sequences")


@dataclass(frozen=True)
class VAETask:
    """Data, model size and training objective of a VAE run (every field is a `train vae` flag)."""

    data: str = option("moses", "moses (MOSES's 1.58M training molecules: pip install --no-deps molsets), rdkit "
                                "(the 14,734 drug-like SMILES shipped with rdkit), a text file with one sequence per "
                                "line, or a .csv/.tsv whose header names a 'smiles' column", metavar="SOURCE")
    smiles_check: bool = option(True, "parse a --data file's lines as SMILES (rdkit), skip invalid ones and keep "
                                      "each molecule once, however often and however it is written (the first "
                                      "line's way, unless --kekule rewrites it); --no-smiles-check: the file is "
                                      "not chemistry (repeated lines are dropped)")
    max_length: int = option(smiles.DEFAULT_MAX_LENGTH, "longer sequences are skipped (counted), in the form the model "
                                                        "learns (with --kekule, the Kekulé form)", lo=1)
    limit: int | None = option(300_000, "use at most this many sequences, the first ones (MOSES's first 300,000: more "
                                        "than 1,800 updates of 128 draw); none: all", lo=1)
    augment: int = option(0, "randomized SMILES per training molecule (Arus-Pous et al. 2019): each time a molecule "
                             "is drawn, it is written one of these ways or canonically; 0: off", lo=0)
    kekule: bool | None = option(None, "write every molecule in Kekulé form (C1=CC=CC=C1, not c1ccccc1): no aromatic "
                                       "atoms whose ring the model must get right: longer strings, more valid samples "
                                       "(docs/vae_experiments.md); default: for SMILES data, not with "
                                       "--no-smiles-check")
    hidden_size: int = option(256, "H of the encoder GRU (and of the decoder's, unless --decoder-hidden-size)", lo=1)
    latent_size: int = option(64, "Z, the latent size", lo=1)
    num_layers: int = option(1, "GRU layers in the encoder", lo=1)
    decoder_hidden_size: int | None = option(None, "H of the decoder GRU", lo=1, none="--hidden-size")
    decoder_layers: int | None = option(2, "GRU layers in the decoder (none: --num-layers); two for more valid "
                                           "samples, docs/vae_experiments.md", lo=1, none="--num-layers")
    bidirectional: bool = option(False, "bidirectional encoder")
    concat_z: bool = option(False, "append z to every decoder input (as MOSES does)")
    decoder_only: bool = option(False, "a CharRNN baseline from the same code: the decoder alone, from a fixed zero "
                                       "latent, trained on reconstruction alone (no encoder, no KL)")
    batch_size: int = option(128, "sequences per step", lo=1)
    bucket_pool: int = option(0, "length bucketing: the molecules of this many batches are drawn together and sorted "
                                   "by length, so that each batch holds similar lengths and is padded only to its "
                                   "longest (rounded up to 8), about 1.5x less work per step, and on MOSES's data "
                                   "fewer valid samples (docs/vae_experiments.md); 0: uniformly random batches, "
                                   "padded to the longest training sequence", lo=0)
    decoding: str = option("teacher", "teacher forcing only, or scheduled sampling per token (the README says what "
                                      "each does to reconstruction and to sampled molecules)", choices=DECODINGS)
    ss_mode: str = option("argmax", "what replaces a token: the model's argmax, a sample, or straight-through Gumbel",
                          choices=SS_MODES)
    ss_schedule: str = option("inverse_sigmoid", "decay of the teacher-forcing probability",
                              choices=TEACHER_FORCING_SCHEDULES)
    ss_midpoint: int = option(1000, "0-based update index N at which the teacher-forcing probability has decayed to "
                                    "0.5: the log's step N + 1 (its step k is logged after k updates)", lo=3)
    ss_max: float = option(0.5, "cap on the replacement probability", lo=0, hi=1)
    word_dropout: float = option(0.0, "word dropout (Bowman et al. 2016): probability that a teacher-forced decoder "
                                      "input is replaced by no token (an all-zero one-hot) in training; teacher "
                                      "decoding only", lo=0, hi=1)
    recon_reduction: str = option("sequence", "the training loss's reconstruction term: cross-entropy summed over each "
                                              "sequence (mean over the batch), or averaged over the batch's tokens "
                                              "(MOSES's; it scales --max-beta and --clip-norm against it). The logged "
                                              "recon is always per sequence", choices=RECON_REDUCTIONS)
    kl_schedule: str = option("linear", "KL weight annealing", choices=KL_SCHEDULES)
    kl_warmup: int = option(500, "0-based update index N from which the linear KL weight is max_beta: the log's step "
                                 "N + 1 (its step k is logged after k updates); sigmoid's midpoint is N / 2; 0: "
                                 "max_beta from the first update, either schedule", lo=0)
    max_beta: float = option(0.2, "final KL weight (MOSES: 0.05, against its per-token loss, --recon-reduction token; "
                                   "1.0 is the ELBO proper, but collapses the latent; 0.2 for more valid samples, "
                                   "docs/vae_experiments.md)", lo=0)
    free_bits: float = option(0.0, "KL free bits per latent dimension (0: off)", lo=0)
    split_seed: int = option(0, "seed of the train/validation/test split", lo=0, hi=validate.SEED_MAX)
    data_seed: int = option(0, "seed of the batch order and of the per-step noise (added to --seed)", lo=0,
                            hi=validate.SEED_MAX)
    eval_samples: int = option(1000, "prior samples drawn by the final evaluation", lo=1)
    eval_sequences: int = option(500, "test sequences reconstructed by the final evaluation (it interpolates between "
                                      "two)", lo=MIN_TEST)

    @property
    def writes_kekule(self) -> bool:
        """Whether the molecules are rewritten in Kekulé form: `kekule`, or by default whenever the data is SMILES."""
        return self.smiles_check if self.kekule is None else self.kekule

    def __post_init__(self):
        check(self)  # every option, before any data is read or any directory written
        if smiles.is_builtin_source(self.data) and self.data != "rdkit":
            smiles.moses_split(self.data, "data")
        if self.kekule is True and not self.smiles_check:
            raise ValueError("kekule: expected False with smiles_check=False (the Kekulé form rewrites molecules; the "
                             "data is not chemistry), got True")
        if self.augment and not self.smiles_check:
            raise ValueError(f"augment: expected 0 with smiles_check=False (randomized SMILES rewrite molecules; the "
                             f"data is not chemistry), got {self.augment}")
        if not self.smiles_check and smiles.is_builtin_source(self.data):
            raise ValueError(
                f"smiles_check: expected True for the built-in source {self.data!r} (always SMILES; False is "
                "for a data file that is not chemistry), got False"
            )
        if self.word_dropout and self.decoding != "teacher":
            # Word dropout thins the teacher's tokens; scheduled sampling already replaces them with the model's
            # own, and the two would share the per-token coin stream (make_loss_fn).
            raise ValueError(f"word_dropout, decoding: expected word_dropout=0 with decoding={self.decoding!r} (word "
                             f"dropout is for teacher forcing), got word_dropout={self.word_dropout}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> VAETask:
        """The task saved with a run; a field the run predates takes the value it ran with (`SAVED_BEFORE`)."""
        validate.saved_names("task", data, (f.name for f in fields(cls)))
        return cls(**{**SAVED_BEFORE, **data})

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
        from jax_scan_rnn import schedules  # JAX: on use, not for the command line's flags

        eps = schedules.make_teacher_forcing_schedule(self.ss_schedule, **self._schedule_params())(step)
        return float(min(self.ss_max, float(schedules.replacement_probability(eps))))

    def beta(self, step: int) -> float:
        """The KL weight at `step`: `kl_schedule` rising to `max_beta` over `kl_warmup` updates."""
        if self.kl_schedule == "constant":
            return self.max_beta
        from jax_scan_rnn import schedules  # JAX: on use, not for the command line's flags

        if self.kl_schedule == "linear":
            return float(schedules.kl_linear(step, warmup=self.kl_warmup, max_beta=self.max_beta))
        if self.kl_warmup == 0:  # no warm-up: max_beta from step 0, as the linear schedule's (its steepness, 10 /
            return self.max_beta  # kl_warmup, would divide by zero)
        return float(schedules.kl_sigmoid(step, midpoint=self.kl_warmup / 2, steepness=10.0 / self.kl_warmup,
                                          max_beta=self.max_beta))


# Fields added with a default other than the behaviour before them: a run saved without the field ran so.
# The values of fields a saved run predates: the decoder had the encoder's layer count until decoder_layers
# existed, batches were uniformly random before bucket_pool, and molecules were written as given before kekule.
SAVED_BEFORE = {"decoder_layers": None, "bucket_pool": 0, "kekule": False}


@dataclass(frozen=True)
class Preset:
    """A named set of `VAETask` (`task`) and `TrainConfig` (`train`) field values; explicit values override
    them (`configs(**overrides)`; on the command line, `train vae --preset NAME` and any explicit flag)."""

    name: str
    summary: str  # one line, the --preset help
    task: Mapping[str, Any]
    train: Mapping[str, Any]

    def __post_init__(self):
        for cls, values in ((VAETask, self.task), (TrainConfig, self.train)):
            unknown = sorted(set(values) - {f.name for f in fields(cls)})
            if unknown:
                raise ValueError(f"{self.name}: expected {cls.__name__} fields, got {unknown}")

    def configs(self, **overrides: Any) -> tuple[VAETask, TrainConfig]:
        """(VAETask, TrainConfig) of the preset, with `overrides` (fields of either) replacing its values: what
        `train vae --preset NAME` builds (its TrainConfig by `command_config`, over `TRAIN_DEFAULTS`)."""
        task_fields = {f.name for f in fields(VAETask)}
        train_fields = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(overrides) - task_fields - train_fields)
        if unknown:
            raise ValueError(f"overrides: expected VAETask or TrainConfig fields, got {unknown}")
        task = {**self.task, **{k: v for k, v in overrides.items() if k in task_fields}}
        train = {**self.train, **{k: v for k, v in overrides.items() if k in train_fields}}
        return VAETask(**task), command_config(TRAIN_DEFAULTS, **train)


# MOSES's VAE (molsets 0.3.1, `moses/vae/config.py`, `model.py`, `trainer.py`, `misc.py`): 100 epochs
# (trainer.py `_n_epoch`: lr_n_period 10 * lr_n_mult 1 ** i over lr_n_restarts 10) of
# ceil(1,584,663 / n_batch 512) = 3,096 batches (a DataLoader that keeps the last, short batch).
MOSES_EPOCH_UPDATES = 3_096
MOSES_UPDATES = 100 * MOSES_EPOCH_UPDATES

PRESETS: dict[str, Preset] = {
    "moses": Preset(
        name="moses",
        summary=f"MOSES's VAE on MOSES's data, {MOSES_UPDATES:,} updates of 512 for one GPU (run time not measured "
                "yet; the differences from MOSES are listed in jax_scan_rnn/configs/vae.py)",
        task=dict(
            data="moses",               # moses/dataset/data/train.csv.gz, 1,584,663 SMILES (our split: 90/5/5)
            limit=None,                 # all of them
            kekule=False,               # MOSES's SMILES as they are (aromatic)
            hidden_size=256,            # config.py q_d_h 256
            num_layers=1,               # config.py q_n_layers 1
            bidirectional=False,        # config.py q_bidir False
            latent_size=128,            # config.py d_z 128
            decoder_hidden_size=512,    # config.py d_d_h 512
            decoder_layers=3,           # config.py d_n_layers 3 (d_dropout 0)
            concat_z=True,              # model.py forward_decoder: torch.cat([x_emb, z_0], dim=-1) at every step
            batch_size=512,             # config.py n_batch 512
            bucket_pool=0,              # trainer.py: a shuffled DataLoader, uniformly random batches
            decoding="teacher",         # model.py forward_decoder: teacher forcing only
            recon_reduction="token",    # model.py: F.cross_entropy(..., ignore_index=pad), a mean over tokens
            kl_schedule="linear",       # misc.py KLAnnealer: kl_w_start 0 + epoch * (kl_w_end - 0) / n_epoch
            kl_warmup=MOSES_UPDATES,    # ... over the whole run (kl_start 0)
            max_beta=0.05,              # config.py kl_w_end 0.05
        ),
        train=dict(
            steps=MOSES_UPDATES,
            learning_rate=3e-4,         # config.py lr_start 3e-4
            lr_schedule="constant",     # misc.py CosineAnnealingLRWithRestart from lr_start to lr_end, both 3e-4
            warmup_steps=0,             # none in trainer.py
            clip_norm=50.0,             # config.py clip_grad 50 (trainer.py clip_grad_norm_)
            weight_decay=0.0,           # trainer.py: optim.Adam, no weight decay
            log_every=100,
            eval_every=MOSES_EPOCH_UPDATES,        # one MOSES epoch (trainer.py validates once per epoch)
            checkpoint_every=MOSES_EPOCH_UPDATES,
        ),
    ),
}
"""The presets of `train vae --preset NAME`.

`moses`: MOSES's VAE, with its hyper-parameters read from molsets 0.3.1's installed source (the comments above
name each value's source), trained for MOSES's 100 epochs of updates on MOSES's training set, in float32 on one
GPU. Its run time is not measured yet. What differs from MOSES, and why:
- Schedules. MOSES's learning rate "SGDR" (`CosineAnnealingLRWithRestart`) anneals from lr_start to lr_end, both
  3e-4, so it is constant: the same here. Its KL weight steps once per epoch (epoch i: 0.05 * i / 100, ending at
  0.0495); ours rises linearly per update and reaches 0.05 at the last one. A shorter `--steps` runs the start
  of MOSES's schedule (the KL weight stays near 0): pass `--kl-warmup` with it to compress the annealing.
- Objective. MOSES averages the cross-entropy over the batch's target tokens and adds the KL weight times the
  KL per molecule (batch mean): `--recon-reduction token` is that loss (so its clip norm of 50 and KL weight
  mean the same here); the logged `recon` stays per molecule.
- Embedding. MOSES feeds both GRUs a trainable V x V embedding initialised to the identity (`OneHotVocab`,
  shared by encoder and decoder); ours feed the one-hot straight into each GRU's input weights: the same
  functions, not the same parameters (or Adam steps).
- Decoder start. MOSES: `h0 = decoder_lat(z)`, one Linear(d_z, d_d_h) repeated for all 3 layers, no tanh; ours:
  `tanh(latent_to_hidden(z))`, one slice of Linear(Z, 3 * 512) per layer.
- Encoder input. MOSES's encoder reads <bos> before the tokens; ours reads the tokens and <eos> only.
- Dropout. MOSES's q_dropout 0.5 acts only between encoder layers (model.py: `if config.q_n_layers > 1`), so with
  one layer it is off, as here; d_dropout is 0.
- Data. MOSES trains on all 1,584,663 training SMILES; ours on 90 % of them (5 % validation, 5 % test), so
  MOSES's 309,600 updates are about 111 of our epochs. MOSES's batches are uniformly random, padded to their
  longest; the preset's are uniformly random too (`--bucket-pool 0`, as `train vae`'s default: length
  bucketing costs validity on MOSES's data, docs/vae_experiments.md), padded to the longest training molecule.
  MOSES writes its molecules aromatic, as the preset does (`--no-kekule`; `train vae` writes Kekulé forms).
- Sampling. MOSES samples with `torch.multinomial` up to 100 tokens; ours with the Gumbel-max trick (the same
  distribution) up to max_length + 1 = 64, beyond the longest MOSES molecule.
MOSES's metrics of a run: `jax-scan-rnn evaluate vae --checkpoint RUN --metrics moses -n 30000`.
"""

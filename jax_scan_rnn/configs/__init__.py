"""Every option of the training commands, as frozen dataclasses (`options.option` fields: name, default, bounds or
choices, help), in modules that do not import JAX: `jax-scan-rnn train ... --help`, and a bad flag's one-line error,
come before the seconds JAX takes to import (measured: docs/measurements.md#the-clis-start-up).

- `train`: `TrainConfig`, the hyper-parameters of `fit`, and the values `jax-scan-rnn train` gives them.
- `traveller`: `TravellerTask`, the Traveller's model, market and objective.
- `vae`: `VAETask`, the VAE's data, model and objective, and the presets of `train vae --preset`.

The recipes that run them (`jax_scan_rnn.train`, `tasks.traveller`, `tasks.vae`) re-export these names.
"""

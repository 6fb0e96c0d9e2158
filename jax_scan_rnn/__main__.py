"""`python -m jax_scan_rnn ...`: the `jax-scan-rnn` command, where the console script is not on PATH."""
import sys

from jax_scan_rnn.cli import main

sys.exit(main())

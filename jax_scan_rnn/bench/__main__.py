"""`python -m jax_scan_rnn.bench [options]`: the same as `jax-scan-rnn bench` (for scripts like gpu.sh)."""
import sys

from jax_scan_rnn.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())

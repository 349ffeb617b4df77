"""Settings for the whole suite.

One torch intra-op thread per process, inherited by every engine, agent and gateway a test starts: the suite
runs two workers on two cores, each starting several engines, and torch's default (a thread per core, which
spin-wait between operations) oversubscribes the cores. Process-level tests then run about a tenth faster and
burn a sixth less CPU. Tests that measure or need a thread count pass --num-threads explicitly."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

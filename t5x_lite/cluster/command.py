"""`t5x-lite launch <target>`: start a run on a cluster (docs/launch.md)."""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import host_memory
from t5x_lite.cluster import slurm as launch_slurm

USAGE = """usage: t5x-lite launch slurm --gin_file=FILE ... --nodes=N [--gpus_per_node=G] [--dry-run]

targets:
  slurm   render launch/slurm/train.sbatch for a gin run and submit it (t5x-lite launch slurm --help)

Cloud TPU slices are started with the scripts in launch/tpu/ (create.sh, install.sh, train.sh, delete.sh).
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "slurm":
        return launch_slurm.main(argv[1:])
    print(f"error: unknown launch target {argv[0]!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    host_memory.run_program(main)

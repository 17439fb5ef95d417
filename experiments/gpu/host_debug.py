"""Debug aid (not a benchmark): the host-updates GPU test's training with faulthandler on,
under a run mode given on the command line (replay on/off, arena on/off); on the GPU machine:

    python3 experiments/gpu/host_debug.py mlp|cnn|lm REPLAY(0|1) ARENA(0|1)
"""
import faulthandler
import json
import sys
from pathlib import Path

faulthandler.enable(all_threads=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tests.test_precision_gpu as tpg  # noqa: E402
from autotm_py.options import RunMode  # noqa: E402

name, replay, arena = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
made = tpg._capped_trainer


def capped(*a, **kw):
    return made(*a, mode=RunMode(arena=arena, replay=replay), **kw)


tpg._capped_trainer = capped
from tests.test_trainer_gpu import train_both  # noqa: E402

print(json.dumps(train_both(name, False, "host"))[:600], flush=True)

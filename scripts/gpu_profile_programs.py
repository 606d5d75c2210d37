"""Where graphmodule's host time goes inside a real program: cProfile of one run on the GPU.

    python scripts/gpu_profile_programs.py td3 [steps]     # prints the top functions by own time
"""

import cProfile
import io
import os
import pstats
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.simplefilter("ignore")

from tests.programs import ppo, sac, td3  # noqa: E402
from tests.programs.common import make_wrap  # noqa: E402

RUNS = {"td3": td3.run_td3, "sac": sac.run_sac, "ppo_tdmodule": lambda w, **k: ppo.run_ppo(w, variant="tdmodule", **k)}

program = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
wrap = make_wrap("graphmodule")
warm = 3 if program.startswith("ppo") else 200
RUNS[program](wrap, steps=warm, device="cuda", seed=0)  # lazy initialisation (a run captures its own graphs)
profile = cProfile.Profile()
profile.enable()
RUNS[program](wrap, steps=steps, device="cuda", seed=1)
profile.disable()
out = io.StringIO()
pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(28)
print(out.getvalue().replace(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/", ""))

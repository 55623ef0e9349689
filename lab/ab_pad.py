"""lab/ab_time.py with the Hopper attention kernel's dynamic shared memory raised by --pad bytes
(unused by the kernel): what a smaller L1 share of the SM costs it."""
import runpy
import sys

import h3kernels._launch.varlen_attention_fp8_sm90a as hopper

i = sys.argv.index("--pad")
hopper.SMEM_BYTES += int(sys.argv[i + 1])
del sys.argv[i:i + 2]
runpy.run_path(__file__.replace("ab_pad.py", "ab_time.py"), run_name="__main__")

"""Static SASS of the Numba row kernel for sm_90 without a GPU: Numba PTX, then ptxas and nvdisasm.
Prints registers and instruction counts by opcode (the kernel is issue-bound: fewer is faster).

NUMBA_ENABLE_CUDASIM=0 PYTHONPATH=. python lab/row_sass.py"""
import collections
import re
import subprocess

import numba
import numpy as np
from numba import cuda
from numba.cuda import dispatcher
dispatcher.get_current_device = lambda: type("D", (), {"compute_capability": (9, 0)})()
from h3kernels._launch.numba import mlp_fp8_row
from h3kernels.cli.compile_check import nvdisasm_path
z=np.zeros; u64=np.uint64
args=(z((2,1344),u64), z(1344,u64), z(9000,u64), z(9000,u64), 4032, 3, z(2,np.int64), 1e-5, z((2,1344),np.uint32), z(2,np.float32))
ptx,_=cuda.compile_ptx(mlp_fp8_row.kernel().py_func, tuple(numba.typeof(a) for a in args), cc=(9,0))
open('/tmp/row.ptx','w').write(ptx)
out=subprocess.run(['ptxas','-arch=sm_90','-v','/tmp/row.ptx','-o','/tmp/row.cubin'],capture_output=True,text=True)
print(out.stderr.strip().splitlines()[-2:])
sass=subprocess.run([nvdisasm_path(),'-c','/tmp/row.cubin'],capture_output=True,text=True).stdout
ins=[l for l in sass.splitlines() if re.match(r'\s+/\*[0-9a-f]{4}\*/',l)]
ops=collections.Counter(re.sub(r'^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?','',l).split()[0].split('.')[0] for l in ins)
print(len(ins), 'static SASS instructions'); print(ops.most_common(25))
open('/tmp/row.sass','w').write(sass)

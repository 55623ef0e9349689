import torch, h3kernels
from h3kernels.demo import make_row_inputs
from h3kernels.shapes import *
m=1
x, w, sc, sh, idx = make_row_inputs(m, 4, device="cuda")
idx[0]=1
q1=torch.zeros(FC1_OUT,HIDDEN,dtype=torch.float8_e4m3fn,device="cuda"); s1=torch.ones(FC1_OUT,device="cuda")
q2=torch.zeros(HIDDEN,FFN,dtype=torch.float8_e4m3fn,device="cuda"); s2=torch.ones(HIDDEN,device="cuda")
gate=torch.randn(4,HIDDEN,device="cuda").bfloat16(); res=torch.randn(m,HIDDEN,device="cuda").bfloat16()
out=h3kernels.minimax_h3_mlp_fp8(x,w,sc,sh,idx,gate,res,q1,s1,q2,s2)
torch.cuda.synchronize(); print("smoke ok", bool(torch.equal(out,res)))

"""An f32 model of trunk_grad_join's arithmetic order, against f64.

The trunk's gradient join (`trunk_grad_join`, a kernel and a finish) forms dz2, masked
by the ReLU of h, from the IQN term, the four branches' dh and three rank-one head terms,
in f32, and sums dz2 (db2), dv h (dwv) and dv (dbv) over the batch in a fixed order: each
thread adds its rows r0 + ty + 8k (16 of them), then the 8 row groups are added, then the
finish's column_block_sum adds the 128 chunks. This script does the same additions in
numpy's float32, in that order, at the step's sizes (B = 16384, H = 256, D = 4), and
compares them with float64 by the GPU test's measure,
max |got - want| / max(|want|, rms(want)).

The bounds of examples/dqn/tests/gpu/trunk.rs (1e-5 for dz2, 1e-4 for the sums) rest on it. Run as
`python3 examples/dqn/join_model.py` (numpy only, CPU); it printed, on 2026-12-01
(bench/BENCHMARKS.md, the trunk join's error model):

    dz2 5.24e-07
    db2 5.33e-07
    dwv 3.28e-07
    dbv 4.02e-08
"""
import numpy as np
rng=np.random.default_rng(1)
B,H,D=16384,256,4
f=np.float32
def u(*s): return rng.uniform(-1,1,s).astype(f)
h=u(B,H); dv=u(B); wv=u(H); br=u(D,B,H); dh_=u(B); wh=u(H); dl=u(B); wl=u(H); iq=u(B,H)
acc=iq.copy()
for k in range(D): acc=(acc+br[k]).astype(f)
z=(acc+(dv[:,None]*wv[None,:]).astype(f)).astype(f)
z=(z+(dh_[:,None]*wh[None,:]).astype(f)).astype(f)
z=(z+(dl[:,None]*wl[None,:]).astype(f)).astype(f)
z=np.where(h>0,z,f(0))
g=iq.astype(np.float64)+br.astype(np.float64).sum(0)+dv[:,None].astype(np.float64)*wv+dh_[:,None].astype(np.float64)*wh+dl[:,None].astype(np.float64)*wl
g=np.where(h>0,g,0.0)
def maxerr(got,want):
    want=np.atleast_1d(want); got=np.atleast_1d(got)
    floor=np.sqrt((want**2).mean())
    return (np.abs(got.astype(np.float64)-want)/np.maximum(np.abs(want),floor)).max()
def ksum(x):
    n=x.shape[1]
    xs=x.reshape(128,16,8,n)
    t=np.zeros((128,8,n),f)
    for k in range(16): t=(t+xs[:,k]).astype(f)
    c=np.zeros((128,n),f)
    for ty in range(8): c=(c+t[:,ty]).astype(f)
    cs=c.reshape(4,32,n)
    tt=np.zeros((32,n),f)
    for k in range(4): tt=(tt+cs[k]).astype(f)
    out=np.zeros(n,f)
    for y in range(32): out=(out+tt[y]).astype(f)
    return out
print("dz2 %.2e" % maxerr(z,g))
print("db2 %.2e" % maxerr(ksum(z),g.sum(0)))
print("dwv %.2e" % maxerr(ksum((dv[:,None]*h).astype(f)),(dv[:,None].astype(np.float64)*h).sum(0)))
print("dbv %.2e" % maxerr(ksum(dv[:,None]),dv.astype(np.float64).sum()))

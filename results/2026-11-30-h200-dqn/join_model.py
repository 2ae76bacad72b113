# An f32 model of trunk_grad_join's arithmetic order (kernel: thread rows r0+ty+8k, then the
# 8 row groups, then the finish's column_block_sum over 128 chunks), against f64, with the
# GPU test's measure: max |got - want| / max(|want|, rms(want)).
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

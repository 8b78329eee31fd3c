# What rounding the value pass's weights p d to 8 bits (16 keys a window) would add to the output error of
# Q8_0 values: relative L2 error of one decode output against f32 values, simulated logits.
# python3 u8_weights_precision.py
import numpy as np
rng=np.random.default_rng(0)
N=8192; D=64
def q8(v):
    v=v.reshape(N,2,32); s=np.abs(v).max(-1,keepdims=True)/127; q=np.round(v/s); return q, s
for sig in (1.0,2.5,4.0):
  errs={}
  for trial in range(5):
    x=rng.normal(0,sig,N); x[0]+=8; x[-5:]+=3
    p=np.exp(x-x.max()); p/=p.sum()
    v=rng.normal(0,1,(N,D)).astype(np.float32)
    q,s=q8(v); vq=(q*s).reshape(N,D)
    ref=p@v; o8=p@vq
    # u8 weights, windows of W keys
    for W in (4,16,64):
      w=(p[:,None]*s[:,:,0])  # N,2
      wq=np.empty_like(w)
      for g in range(0,N,W):
        blk=w[g:g+W]; m=blk.max(0,keepdims=True)
        wq[g:g+W]=np.round(blk/m*255)*m/255
      ou=np.einsum('nb,nbk->bk',wq,q).reshape(D)
      errs.setdefault(W,[]).append(np.linalg.norm(ou-ref)/np.linalg.norm(ref))
    errs.setdefault('q8',[]).append(np.linalg.norm(o8-ref)/np.linalg.norm(ref))
  print(sig, {k:round(float(np.mean(e))*100,3) for k,e in errs.items()}, 'max p',round(float(p.max()),3))

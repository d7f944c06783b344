"""Independent float64 numpy implementations of the attention formulas (README 'The variants'),
written head by head.

Shares no code with the package: used to check every attention path.
"""
from __future__ import annotations

import numpy as np

EPS = 1e-5


def rope(x_TNH: np.ndarray, pos_T: np.ndarray, theta: float) -> np.ndarray:
  """Interleaved pairs (2i, 2i+1) rotated as complex numbers by pos * theta^(-2i/H)."""
  width = x_TNH.shape[-1]
  freq = theta ** (-np.arange(0, width, 2) / width)
  z = (x_TNH[..., 0::2] + 1j * x_TNH[..., 1::2]) * np.exp(1j * pos_T[:, None] * freq)[:, None, :]
  out = np.empty_like(x_TNH)
  out[..., 0::2], out[..., 1::2] = z.real, z.imag
  return out


def allowed(seg_T: np.ndarray | None, T: int, causal: bool = True) -> np.ndarray:
  ok = np.ones((T, T), bool)
  if causal:
    ok &= np.tril(np.ones((T, T), bool))
  if seg_T is not None:
    ok &= seg_T[:, None] == seg_T[None, :]
  return ok


def softmax_map(q_TH, k_SH, ok_TS, scale):
  logits = q_TH @ k_SH.T * scale
  logits = np.where(ok_TS, logits, -np.inf)
  logits -= logits.max(-1, keepdims=True)
  w = np.exp(logits)
  return w / w.sum(-1, keepdims=True)


def lambda_init(layer: int) -> float:
  return 0.8 - 0.6 * np.exp(-0.3 * layer)


def diff_v1(x_BTD, w, *, h, K, d, layer, seg=None, theta=1e4, subln=True, shared=False,
            lam_init=None, out_scale=None):
  """DIFF V1 (or Shared DIFF with shared=True) attention sub-layer, float64. lam_init: a constant
  lambda_init instead of the layer rule; out_scale: the branch's multiplier before W_O (after the
  sub-layer norm, where there is one), a number or "layer_rule" (1 - the layer rule's
  lambda_init), instead of (1 - lambda_init) with the norm and 1 without."""
  B, T, _ = x_BTD.shape
  pos = np.arange(T, dtype=np.float64)
  lam0 = lambda_init(layer) if lam_init is None else lam_init
  lam = (np.exp(np.sum(w["lambda_q1"] * w["lambda_k1"]))
         - np.exp(np.sum(w["lambda_q2"] * w["lambda_k2"])) + lam0)
  out = np.zeros((B, T, h * 2 * d))
  for b in range(B):
    x = x_BTD[b]
    if shared:
      q1 = (x @ w["wq/kernel"] + x @ w["u_q1/kernel"] @ w["v_q1/kernel"]).reshape(T, h, d)
      q2 = (x @ w["wq/kernel"] + x @ w["u_q2/kernel"] @ w["v_q2/kernel"]).reshape(T, h, d)
      k1 = (x @ w["wk/kernel"] + x @ w["u_k1/kernel"] @ w["v_k1/kernel"]).reshape(T, K, d)
      k2 = (x @ w["wk/kernel"] + x @ w["u_k2/kernel"] @ w["v_k2/kernel"]).reshape(T, K, d)
    else:
      q = (x @ w["wq/kernel"]).reshape(T, 2 * h, d)
      k = (x @ w["wk/kernel"]).reshape(T, 2 * K, d)
      q1, q2 = q[:, 0::2], q[:, 1::2]  # head i: sub-heads 2i, 2i+1
      k1, k2 = k[:, 0::2], k[:, 1::2]
    v = (x @ w["wv/kernel"]).reshape(T, K, 2 * d)
    q1, q2, k1, k2 = (rope(t, pos, theta) for t in (q1, q2, k1, k2))
    ok = allowed(None if seg is None else seg[b], T)
    for i in range(h):
      g = i // (h // K)  # the whole (K1, K2) pair of key group g
      a1 = softmax_map(q1[:, i], k1[:, g], ok, d ** -0.5)
      a2 = softmax_map(q2[:, i], k2[:, g], ok, d ** -0.5)
      head = (a1 - lam * a2) @ v[:, g]
      rule = 1.0
      if subln:
        head = head / np.sqrt(np.mean(head ** 2, -1, keepdims=True) + EPS) * w["subln_scale"]
        rule = 1 - lam0
      head = head * (rule if out_scale is None else
                     (1 - lambda_init(layer)) if out_scale == "layer_rule" else out_scale)
      out[b, :, i * 2 * d:(i + 1) * 2 * d] = head
  return out @ w["wo/kernel"]


def diff_v2(x_BTD, w, *, h, K, d, seg=None, theta=1e4, pairing="interleaved", lam_mode="sigmoid",
            out_scale=None):
  """DIFF V2's sub-layer, float64; out_scale: a fixed multiplier before W_O (None: 1)."""
  B, T, _ = x_BTD.shape
  pos = np.arange(T, dtype=np.float64)
  out = np.zeros((B, T, h * d))
  for b in range(B):
    x = x_BTD[b]
    q = rope((x @ w["wq/kernel"]).reshape(T, 2 * h, d), pos, theta)
    k = rope((x @ w["wk/kernel"]).reshape(T, K, d), pos, theta)
    v = (x @ w["wv/kernel"]).reshape(T, K, d)
    ok = allowed(None if seg is None else seg[b], T)
    o = [softmax_map(q[:, n], k[:, n // (2 * h // K)], ok, d ** -0.5) @ v[:, n // (2 * h // K)]
         for n in range(2 * h)]
    raw = x @ w["wlambda/kernel"] if lam_mode != "none" else np.ones((T, h))
    lam = 1 / (1 + np.exp(-raw)) if lam_mode == "sigmoid" else raw
    for j in range(h):
      a, c = (2 * j, 2 * j + 1) if pairing == "interleaved" else (j, h + j)
      out[b, :, j * d:(j + 1) * d] = o[a] - lam[:, j:j + 1] * o[c]
  return (out if out_scale is None else out * out_scale) @ w["wo/kernel"]


def transformer(x_BTD, w, *, N, K, d, seg=None, theta=1e4, head_norm=False, out_scale=None):
  B, T, _ = x_BTD.shape
  pos = np.arange(T, dtype=np.float64)
  out = np.zeros((B, T, N * d))
  for b in range(B):
    x = x_BTD[b]
    q = rope((x @ w["wq/kernel"]).reshape(T, N, d), pos, theta)
    k = rope((x @ w["wk/kernel"]).reshape(T, K, d), pos, theta)
    v = (x @ w["wv/kernel"]).reshape(T, K, d)
    ok = allowed(None if seg is None else seg[b], T)
    for n in range(N):
      g = n // (N // K)
      head = softmax_map(q[:, n], k[:, g], ok, d ** -0.5) @ v[:, g]
      if head_norm:  # per-head RMSNorm, one gain for all heads
        head = head / np.sqrt(np.mean(head ** 2, -1, keepdims=True) + EPS) * w["head_norm_scale"]
      head = head * (1.0 if out_scale is None else out_scale)  # before W_O, norm or not
      out[b, :, n * d:(n + 1) * d] = head
  return out @ w["wo/kernel"]

"""Plain NumPy loop implementations: the oracle the references are checked against."""
import numpy as np


def write_kv(k_pages, v_pages, k_new, v_new, page_table, start_pos, lengths):
    kp, vp = np.array(k_pages), np.array(v_pages)
    ps = kp.shape[1]
    for r in range(k_new.shape[0]):
        for t in range(int(lengths[r])):
            pos = int(start_pos[r]) + t
            page = int(page_table[r, pos // ps])
            kp[page, pos % ps] = k_new[r, t]
            vp[page, pos % ps] = v_new[r, t]
    return kp, vp


def _attend(qv, keys, vals, scale):
    """qv [Hq, D]; keys/vals [S, Hkv, D] -> [Hq, D]."""
    hq, hkv = qv.shape[0], keys.shape[1]
    out = np.zeros(qv.shape, np.float64)
    for h in range(hq):
        kh = h // (hq // hkv)
        s = keys[:, kh] @ qv[h] * scale
        p = np.exp(s - s.max())
        p /= p.sum()
        out[h] = p @ vals[:, kh]
    return out


def _row_keys(pages, table, n):
    ps = pages.shape[1]
    return np.stack([pages[int(table[i // ps]), i % ps] for i in range(n)]).astype(np.float64)


def prefill_attention(q, k_pages, v_pages, page_table, start_pos, lengths, scale):
    q = np.asarray(q, np.float64)
    out = np.zeros(q.shape, np.float64)
    for r in range(q.shape[0]):
        for t in range(int(lengths[r])):
            n = int(start_pos[r]) + t + 1
            out[r, t] = _attend(q[r, t], _row_keys(k_pages, page_table[r], n),
                                _row_keys(v_pages, page_table[r], n), scale)
    return out


def decode_attention(q, k_pages, v_pages, page_table, context_lens, scale):
    q = np.asarray(q, np.float64)
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        n = int(context_lens[b])
        if n:
            out[b] = _attend(q[b], _row_keys(k_pages, page_table[b], n),
                             _row_keys(v_pages, page_table[b], n), scale)
    return out


def gated_delta_rule(q, k, v, g, beta, state):
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    s = np.array(state, np.float64)
    r, t, h, _ = q.shape
    o = np.zeros(v.shape, np.float64)
    for ri in range(r):
        for hi in range(h):
            st = s[ri, hi]
            for ti in range(t):
                st = st * np.exp(g[ri, ti, hi])
                kv = k[ri, ti, hi] @ st
                delta = beta[ri, ti, hi] * (v[ri, ti, hi] - kv)
                st = st + np.outer(k[ri, ti, hi], delta)
                o[ri, ti, hi] = q[ri, ti, hi] @ st
            s[ri, hi] = st
    return o, s


def conv1d(x, conv_state, weight, lengths):
    x, conv_state, weight = (np.asarray(a, np.float64) for a in (x, conv_state, weight))
    r, t, c = x.shape
    kk = weight.shape[1]
    y = np.zeros(x.shape)
    new_state = conv_state.copy()
    for ri in range(r):
        hist = list(conv_state[ri])  # rolling window of inputs
        for ti in range(t):
            window = np.stack(hist[-(kk - 1):] + [x[ri, ti]])  # [K, C]
            acc = (window * weight.T).sum(0)
            y[ri, ti] = acc / (1.0 + np.exp(-acc))
            hist.append(x[ri, ti])
            if ti + 1 == int(lengths[ri]):
                new_state[ri] = np.stack(hist[-(kk - 1):])
    return y, new_state

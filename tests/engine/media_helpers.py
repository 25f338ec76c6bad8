"""Checks shared by the engine's media tests: a completion against the whole-sequence reference."""
import numpy as np


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def check_against_forward(model, prompt, images, videos, got):
    """Every generated token is the reference's argmax, and its logprob and top-k (ids and
    values) are within 1e-3 of the log-softmax of `Model.forward` over prompt + output."""
    logits = np.asarray(model.forward(list(prompt) + list(got.token_ids[:-1]), images=images, videos=videos))
    for j, (token, lp) in enumerate(zip(got.token_ids, got.logprobs)):
        ref = _log_softmax(logits[len(prompt) - 1 + j])
        assert token == int(np.argmax(ref)), j
        assert abs(lp.logprob - ref[token]) <= 1e-3
        for t, v in lp.top:
            assert abs(v - ref[t]) <= 1e-3
        assert [t for t, _ in lp.top] == list(np.argsort(-ref, kind="stable")[:len(lp.top)])

"""Metric code on hand-built logits with known answers."""

import math

import numpy as np
import pytest

from qwen_onnx.measure.metrics import AccuracyAccumulator, kl_divergence, log_softmax, perplexity, token_nll


def test_perplexity_of_uniform_distribution_is_vocabulary_size():
    vocab = 50
    logits = np.zeros((7, vocab), dtype=np.float32)
    targets = np.arange(7)
    assert perplexity(token_nll(logits, targets)) == pytest.approx(vocab, rel=1e-9)


def test_perplexity_of_certain_prediction_is_one():
    logits = np.full((3, 4), -1e4, dtype=np.float32)
    targets = np.array([1, 2, 3])
    logits[np.arange(3), targets] = 0.0
    assert perplexity(token_nll(logits, targets)) == pytest.approx(1.0, abs=1e-9)


def test_perplexity_of_no_tokens_is_an_error():
    with pytest.raises(ValueError, match="at least one token"):
        perplexity(np.array([]))


def test_kl_of_identical_distributions_is_zero():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 11))
    np.testing.assert_allclose(kl_divergence(logits, logits), 0.0, atol=1e-12)
    # a constant shift of the logits is the same distribution
    np.testing.assert_allclose(kl_divergence(logits, logits + 3.0), 0.0, atol=1e-12)


def test_kl_matches_closed_form_for_two_tokens():
    p = np.array([0.75, 0.25])
    q = np.array([0.5, 0.5])
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    got = kl_divergence(np.log(p)[None], np.log(q)[None])
    assert got[0] == pytest.approx(expected, rel=1e-12)


def test_log_softmax_is_stable_for_large_logits():
    out = log_softmax(np.array([[1000.0, 1000.0]]))
    np.testing.assert_allclose(out, np.log([[0.5, 0.5]]))


def test_accumulator_summary_on_a_deliberately_shifted_variant():
    vocab = 8
    reference = np.zeros((4, vocab), dtype=np.float32)
    reference[:, 0] = 5.0  # the reference always predicts token 0
    variant = reference.copy()
    variant[2:, 0] = 0.0
    variant[2:, 1] = 5.0  # the variant predicts token 1 on half the positions
    targets = np.zeros(4, dtype=np.int64)
    acc = AccuracyAccumulator()
    acc.add(reference, variant, targets)
    s = acc.summary()
    assert s["tokens"] == 4
    assert s["top1_pct"] == pytest.approx(50.0)
    assert s["max_abs_logit_diff"] == pytest.approx(5.0)
    assert s["mean_abs_logit_diff"] == pytest.approx(2 * 2 * 5.0 / (4 * vocab))
    assert s["ppl"] > s["ppl_reference"]
    assert s["ppl_delta_pct"] > 0
    assert s["kl_median"] >= 0 and s["kl_p99"] >= s["kl_median"]


def test_accumulator_counts_nan_and_rejects_shape_mismatch():
    acc = AccuracyAccumulator()
    reference = np.zeros((2, 3), dtype=np.float32)
    variant = reference.copy()
    variant[0, 0] = np.nan
    acc.add(reference, variant, np.array([0, 1]))
    assert acc.summary()["nonfinite_logits"] == 1
    with pytest.raises(ValueError, match="shapes differ"):
        acc.add(reference, np.zeros((2, 4), dtype=np.float32), np.array([0, 1]))


def test_accumulator_chunks_give_the_whole_window_figures_bit_for_bit():
    # a window longer than CHUNK_TOKENS (and not a multiple of it): the chunked log-softmax must give
    # exactly what token_nll / kl_divergence give on the whole window, so no printed figure moves
    from qwen_onnx.measure.metrics import CHUNK_TOKENS

    rng = np.random.default_rng(0)
    tokens, vocab = 2 * CHUNK_TOKENS + 7, 1000
    reference = rng.normal(scale=4.0, size=(tokens, vocab)).astype(np.float32)
    variant = reference + rng.normal(scale=0.3, size=(tokens, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, size=tokens)
    acc = AccuracyAccumulator()
    acc.add(reference, variant, targets)
    assert np.array_equal(np.concatenate(acc.reference_nll), token_nll(reference, targets))
    assert np.array_equal(np.concatenate(acc.variant_nll), token_nll(variant, targets))
    assert np.array_equal(np.concatenate(acc.kl), kl_divergence(reference, variant))
    assert acc.summary()["tokens"] == tokens

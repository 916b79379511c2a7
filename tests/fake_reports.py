"""Hand-made inspect, accuracy and latency reports of a set of variants, for the report stage."""

import json


def fake_reports(tmp_path, variants):
    files = {"inspect": [], "accuracy": [], "latency": [], "pytorch": []}
    latency_base = {"load_s": 1.0, "prefill_ms_p50_8": 10.0, "prefill_ms_p90_8": 12.0, "ttft_ms": 20.0,
                    "decode_tok_s": 10.0, "peak_rss_mib": 1000.0, "bytes_on_disk": 4_000_000,
                    "weight_bytes_per_token": 1_000_000_000, "threads": 2, "provider": "x"}
    torch_path = tmp_path / "pytorch.latency.json"
    torch_path.write_text(json.dumps(latency_base))
    files["pytorch"].append(torch_path)
    for i, variant in enumerate(variants):
        broken = variant == "int8-static"
        accuracy = {"tokens": 100, "ppl": 80.0 if broken else 12.1, "ppl_reference": 12.0,
                    "ppl_delta_pct": 566.7 if broken else 0.8, "kl_mean": 1.2 if broken else 0.01, "kl_median": 0.0,
                    "kl_p99": 0.1, "top1_pct": 40.0 if broken else 99.0, "max_abs_logit_diff": 1.0,
                    "mean_abs_logit_diff": 0.1, "padded_batch_max_abs_diff": 0.0, "padded_batch_nonfinite": 0,
                    "kv_cache_max_abs_diff": 0.0, "generation_match_pct": 100.0,
                    "gate": "FAIL" if broken else "PASS",
                    "gate_failures": ["ppl_delta_pct 566.7 > 2"] if broken else [],
                    "generation": [{"prompt": "p", "pytorch": "a", "onnx": "b", "matched_tokens": 0,
                                    "pytorch_tokens": 1, "onnx_tokens": 1}]}
        latency = {**latency_base, "decode_tok_s": 20.0 + i, "profile": {"total_ms": 1.0, "ops": [
            {"op_type": "MatMul", "ms": 0.7, "pct": 70.0, "calls": 3}]}}
        inspect = {"nodes": 10 + i, "quant_ops": {"QuantizeLinear": i}, "initializers": {"count": 3},
                   "bytes_on_disk": 4_000_000, "opsets": {"ai.onnx": 17}, "architecture": {"layers": 2}}
        for kind, data in (("inspect", inspect), ("accuracy", accuracy), ("latency", latency)):
            path = tmp_path / f"{variant}.{kind}.json"
            path.write_text(json.dumps(data))
            files[kind].append(path)
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"cpu_model": "test cpu", "memory_bandwidth_gb_s": 20.0, "logical_cores": 2}))
    return files, machine

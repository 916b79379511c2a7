"""lab.gptq_maps: the fixed precision maps it compares, from a run's int4 record."""

import json

from lab.gptq_maps import precision_maps


def test_the_maps_are_the_shipped_one_and_every_matmul_at_4_32_with_and_without_the_lm_head(tmp_path):
    shipped = {"/model/layers.0/mlp/down_proj/MatMul": "8/128", "/model/layers.0/mlp/gate_proj/MatMul": "4/64",
               "/lm_head/MatMul": "8/128"}
    (tmp_path / "int4").mkdir()
    (tmp_path / "int4" / "quantize.json").write_text(json.dumps({"lm_head": "/lm_head/MatMul", "precision": shipped}))
    maps = precision_maps(tmp_path)
    assert maps["shipped"] == shipped
    assert maps["mlp-attention-4bit"] == {"/model/layers.0/mlp/down_proj/MatMul": "4/32",
                                          "/model/layers.0/mlp/gate_proj/MatMul": "4/32", "/lm_head/MatMul": "8/128"}
    assert set(maps["all-4bit"].values()) == {"4/32"} and set(maps["all-4bit"]) == set(shipped)

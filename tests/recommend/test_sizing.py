"""Memory estimates against the field's known tiers, and the fitting configurations from the real catalog."""

from __future__ import annotations

import json

import pytest

from gpufinops.prices.catalog import load_catalog
from gpufinops.cli import main
from gpufinops.recommend.sizing import SizingAssumptions, SizingError, estimate_memory, fitting_options, model_shape

A = SizingAssumptions()


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_model_shape_matches_llama_class_models():
    layers, hidden = model_shape(70e9)
    assert 70 <= layers <= 90 and 7500 <= hidden <= 9000  # Llama-2/3 70B: 80 layers, 8192
    assert abs(12 * layers * hidden**2 - 70e9) / 70e9 < 0.02


@pytest.mark.parametrize("params", [8e9, 13e9])
def test_peft_of_8_to_13b_fits_one_a100_80gb(params, catalog):
    est = estimate_memory(params, "peft", "bf16")
    assert est.total_gb <= 80 * A.usable_memory_fraction
    options = fitting_options(est, catalog, limit=500)
    single_a100 = [o for o in options if o.offer.gpu == "A100-80GB" and o.gpus_needed == 1]
    assert single_a100, "no single A100 80GB option"


def test_full_finetune_70b_needs_about_840gb_and_multi_gpu(catalog):
    est = estimate_memory(70e9, "full-finetune", "bf16")
    assert est.states_gb == pytest.approx(840, rel=0.01)  # 12 bytes/param: bf16 w + bf16 g + fp32 Adam m,v
    assert est.total_gb > est.states_gb
    options = fitting_options(est, catalog, limit=500)
    assert options and min(o.gpus_needed for o in options) > 1
    # 8x 80 GB is not enough for the states alone
    assert not [o for o in options if o.offer.gpu in ("H100", "A100-80GB")]


def test_405b_fp8_inference_fits_8x_h100(catalog):
    est = estimate_memory(405e9, "inference", "fp8", context=8192, batch=8)
    assert est.weights_gb == pytest.approx(405)
    aws = fitting_options(est, catalog, providers=["aws"], limit=50)
    assert "p5.48xlarge" in [o.offer.instance_type for o in aws]
    assert all(catalog.gpus[o.offer.gpu].fp8_tflops for o in aws)  # FP8 needs FP8 tensor cores
    bf16 = estimate_memory(405e9, "inference", "bf16", context=8192, batch=8)
    assert "p5.48xlarge" not in [o.offer.instance_type for o in fitting_options(bf16, catalog, ["aws"], 50)]


def test_options_are_cheapest_first_and_hold_the_estimate(catalog):
    est = estimate_memory(13e9, "inference", "bf16", context=8192, batch=8)
    options = fitting_options(est, catalog, limit=20)
    prices = [o.hourly for o in options]
    assert prices == sorted(prices)
    for o in options:
        assert o.gpus_needed <= o.offer.gpu_count
        assert o.per_gpu_gb <= o.offer.gpu_memory_gb * A.usable_memory_fraction


def test_pretrain_adds_fp32_master_weights():
    ft = estimate_memory(7e9, "full-finetune", "bf16")
    pt = estimate_memory(7e9, "pretrain", "bf16")
    assert pt.optimizer_gb - ft.optimizer_gb == pytest.approx(7e9 * A.master_weights_bytes_pretrain / 1e9)


def test_kv_cache_grows_with_context_and_batch():
    small = estimate_memory(70e9, "inference", "bf16", context=2048, batch=1)
    big = estimate_memory(70e9, "inference", "bf16", context=8192, batch=8)
    assert big.activations_gb == pytest.approx(small.activations_gb * 32)
    assert big.weights_gb == small.weights_gb


@pytest.mark.parametrize("mode,precision", [("full-finetune", "int4"), ("pretrain", "int8")])
def test_quantised_full_training_is_refused(mode, precision):
    with pytest.raises(SizingError, match="peft"):
        estimate_memory(7e9, mode, precision)


def test_size_cli_json(capsys):
    rc = main(["size", "--params", "70B", "--mode", "inference", "--precision", "bf16", "-o", "json",
               "--provider", "aws", "--limit", "3"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["weights_gb"] == pytest.approx(140)
    assert 1 <= len(out["options"]) <= 3 and all(o["provider"] == "aws" for o in out["options"])


def test_size_cli_rejects_bad_params(capsys):
    with pytest.raises(SystemExit):
        main(["size", "--params", "seventy", "--mode", "peft"])
    assert "--params" in capsys.readouterr().err

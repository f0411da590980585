"""``mdc bench``: the harness runs at micro dimensions and reports well-formed figures (never timing asserts)."""

import json
import math

import pytest

from mdc_core.config import load_preset
from mdc_workbench.bench.coca import build_coca, coca_config
from mdc_workbench.bench.core import BenchConfig, datasheet_peak
from mdc_workbench.bench.run import add_mfu, format_report, run_bench, targets
from mdc_workbench.cli import main
from tests.conftest import MICRO, micro_config

MICRO_OVERRIDES = [f"model.{k}={json.dumps(v)}" for k, v in MICRO.items()] + ["train.batch_size=4"]


def _numbers(node, path=""):
    """Every (path, number) leaf of a JSON tree; booleans are flags, not figures."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


SAVED: list[dict] = []  # what run_bench handed its `save` callback, section by section


@pytest.fixture(scope="module")
def report():
    bench = BenchConfig.quick(overrides=MICRO_OVERRIDES, threads=1, caption_length=8, isolate=False, count_ops=True)
    return run_bench(bench, save=lambda r: SAVED.append(json.loads(json.dumps(r))))


def test_the_report_is_saved_after_each_section(report):
    """An interrupted run keeps what it measured: the first save holds the training rows and no captions yet."""
    assert len(SAVED) >= 3
    assert "train" in SAVED[0] and "caption" not in SAVED[0]
    assert "caption" in SAVED[1] and "scoring" not in SAVED[1]
    assert SAVED[-1]["targets"] == json.loads(json.dumps(report["targets"]))


def test_rows_count_their_host_operations(report):
    for name in ("mdc", "arc"):
        ops = report["train"][name]["host_ops"]
        assert ops["aten_ops_per_step"] > 50 and ops["events_per_step"] >= ops["aten_ops_per_step"]
    assert "host operations per training step" in format_report(report)


def test_datasheet_peaks_by_the_device_name_torch_gives():
    tflops = {name: datasheet_peak(name)["flops_per_s"] / 1e12 for name in (
        "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA GH200 480GB",
        "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA L40", "NVIDIA L4", "NVIDIA A10")}
    assert tflops == {"NVIDIA H200": 989.5, "NVIDIA H100 80GB HBM3": 989.5, "NVIDIA H100 PCIe": 756.5,
                      "NVIDIA H100 NVL": 835.5, "NVIDIA GH200 480GB": 989.5, "NVIDIA A100-SXM4-80GB": 312.0,
                      "NVIDIA A100 80GB PCIe": 312.0, "NVIDIA L40S": 362.05, "NVIDIA L40": 181.05,
                      "NVIDIA L4": 121.0, "NVIDIA A10": 125.0}  # L40S is not an L4, an A100 not an A10
    assert "datasheet" in datasheet_peak("NVIDIA H200")["source"]
    assert datasheet_peak("") is None and datasheet_peak("Tesla T4") is None and datasheet_peak("NVIDIA A10G") is None


def test_mfu_against_both_peaks_by_hand(report):
    rows = {"mdc": {"flops_per_step": 4e12, "step_s": 0.02}, "broken": {"error": "timed out"}}
    add_mfu(rows, {"flops_per_s": 400e12}, datasheet_peak("NVIDIA H200"))  # 4e12 / 0.02 s = 200 TFLOP/s
    assert rows["mdc"]["mfu"] == pytest.approx(0.5) and rows["mdc"]["mfu_datasheet"] == pytest.approx(200 / 989.5)
    assert "mfu" not in rows["broken"]
    add_mfu(rows, {"flops_per_s": 400e12}, None)  # a CPU: no datasheet figure
    assert rows["mdc"]["mfu_datasheet"] is None
    assert report["datasheet_peak"] is None and "datasheet peak: none" in format_report(report)
    fake = json.loads(json.dumps(report))  # the CPU report as if its device were an H200
    fake["datasheet_peak"] = datasheet_peak("NVIDIA H200")
    add_mfu(fake["train"], fake["matmul_peak"], fake["datasheet_peak"])
    text = format_report(fake)
    assert "datasheet peak: 989.5 TFLOP/s" in text and "H200 SXM datasheet" in text
    mdc = fake["train"]["mdc"]
    assert mdc["mfu_datasheet"] == pytest.approx(mdc["model_flops_per_s"] / 989.5e12)
    row = next(line for line in text.splitlines() if line.startswith("mdc "))
    assert row.split()[-2:] == [f"{mdc['mfu']:.3g}", f"{mdc['mfu_datasheet']:.3g}"]


def test_a_row_past_its_time_limit_is_an_error_that_names_it(tmp_path):
    from mdc_workbench.bench.training import run_train_bench

    got = run_train_bench(["mdc"], tmp_path / "payload.pt", steps=1, warmup=1, device="cpu", threads=1,
                          timeout_s=0.01)
    assert "row 'mdc' timed out after" in got["mdc"]["error"]


def test_best_rows_by_prefix_leave_out_the_full_vocabulary_head():
    from mdc_workbench.bench.run import _best

    report = {"train": {"mdc": {"samples_per_s": 10.0}, "mdc_graphs": {"samples_per_s": 30.0},
                        "mdc_full_vocab": {"samples_per_s": 99.0}, "arc": {"samples_per_s": 20.0},
                        "arc_graphs": {"error": "row 'arc_graphs' timed out"}}}
    assert _best(report, "mdc", "samples_per_s") == 30.0
    assert _best(report, "arc", "samples_per_s") == 20.0
    assert _best(report, "coca", "samples_per_s") is None


def test_quick_report_structure(report):
    assert set(report) >= {"machine", "settings", "dimensions", "matmul_peak", "train", "caption", "scoring",
                           "quality", "targets"}
    assert report["dimensions"]["decoder_width"] == MICRO["text_width"]
    assert set(report["train"]) == {"mdc", "arc", "coca"}
    for name, row in report["train"].items():
        assert "error" not in row, (name, row.get("error"))
        assert {"samples_per_s", "step_s", "peak_mem_mib", "flops_per_step", "mfu"} <= set(row)
    assert set(report["caption"]) == {"batch_1", "batch_4"}
    for section in report["caption"].values():
        assert set(section) == {"mdc_uncached", "mdc_cached", "mdc_threshold", "arc_kv", "coca_generate"}
        for row in section.values():
            assert row.get("available", True) is False or {"latency_s", "captions_per_s", "steps"} <= set(row)
    # the cache is exact: the bench's cached and uncached samplers write the same captions
    assert report["caption"]["batch_4"]["mdc_cached"]["same_tokens_as_uncached"] is True
    assert report["caption"]["batch_1"]["mdc_uncached"]["steps"] == 8  # N' decoder passes, one token each
    assert report["caption"]["batch_1"]["coca_generate"]["steps"] == 9  # N' tokens + the forced <eot>
    # MFU is taken against the peak of the precision the step trains in: fp32 on the CPU (bf16 on CUDA)
    assert report["matmul_peak"]["dtype"] == "float32"
    assert "float32 matmul peak" in format_report(report)
    # the cached and uncached Monte Carlo rows score the same pairs, so their captions/s compare
    assert report["scoring"]["mc"]["pairs"] == report["scoring"]["mc_uncached"]["pairs"] == 2
    json.dumps(report)  # --json must be able to print it
    assert "training step" in format_report(report)


def test_every_figure_is_positive_and_finite(report):
    figures = [(p, x) for key in ("matmul_peak", "train", "caption", "scoring")
               for p, x in _numbers(report[key], key)]
    assert len(figures) > 40
    # a CPU row's peak_mem_mib is the peak RSS of its timed steps minus the RSS before them: 0 when the steps
    # allocate nothing the warm-up did not (the allocator reuses its pages), never negative
    bad = [(p, x) for p, x in figures
           if not (math.isfinite(x) and (x >= 0 if p.endswith("peak_mem_mib") else x > 0))]
    assert not bad, bad
    # a missing piece is a note, never a number
    for section in (*report["caption"].values(), report["scoring"]):
        for row in section.values():
            if row.get("available", True) is False:
                assert set(row) == {"available", "note"}


def test_targets_ratios_by_hand():
    report = {
        "train": {"mdc": {"samples_per_s": 26.0, "mfu": 0.1}, "coca": {"samples_per_s": 20.0}},
        "caption": {"batch_1": {"mdc_uncached": {"latency_s": 0.9}, "mdc_cached": {"latency_s": 0.3}},
                    "batch_64": {"mdc_cached": {"captions_per_s": 50.0}, "coca_generate": {"captions_per_s": 100.0}}},
        "scoring": {"mc": {"latency_one_pair_s": 0.5, "samples": 1024}},
        "quality": {"available": False, "note": "x"},
    }
    got = {t["target"].split(" ")[0] + str(i): (t["value"], t["reached"]) for i, t in enumerate(targets(report))}
    values = list(got.values())
    assert values[0] == (pytest.approx(1.3), True)  # 26 / 20 = 1.3 >= 1.3
    assert values[1] == (pytest.approx(3.0), True)  # 0.9 / 0.3
    assert values[2] == (pytest.approx(0.5), False)  # 50 / 100
    assert values[3] == (None, None)  # no trained runs: not measured
    assert values[4] == (pytest.approx(0.5), True)  # lower is better: 0.5 s < 1 s
    assert values[5] == (pytest.approx(0.1), False)
    assert values[6] == (None, None)  # no ARC row
    assert values[7] == (pytest.approx(1.3), False)  # 26 / 20 < 2.5
    assert values[8] == (pytest.approx(0.1), False)  # 0.1 < 0.25 (batch < 256)


def test_coca_peer_mirrors_our_dimensions():
    cfg = micro_config(text_layers=3)
    kw = coca_config(cfg)
    assert kw["text_cfg"]["layers"] + kw["multimodal_cfg"]["layers"] == 3  # depth-matched: 1 + 2
    assert kw["vision_cfg"]["width"] == MICRO["encoder_kwargs"]["embed_dim"]
    assert kw["vision_cfg"]["layers"] == MICRO["encoder_kwargs"]["depth"]
    assert kw["vision_cfg"]["patch_size"] == MICRO["encoder_kwargs"]["patch_size"]
    assert kw["multimodal_cfg"]["width"] == MICRO["text_width"] and kw["multimodal_cfg"]["vocab_size"] == 49408
    full = coca_config(cfg, "open_clip")
    assert full["text_cfg"]["layers"] == full["multimodal_cfg"]["layers"] == 3
    model = build_coca(cfg)
    assert len(model.text_decoder.resblocks) == 2 and len(model.visual.transformer.resblocks) == 1
    with pytest.raises(ValueError, match="layout"):
        coca_config(cfg, "nope")
    with pytest.raises(ValueError, match="no convolutional stem"):  # tiny has one: the bench uses tiny_vit
        coca_config(load_preset("tiny").model)


def test_cli_rejects_bad_options(capsys):
    assert main(["bench", "--rows", "mdc,nope"]) == 2
    assert "unknown training rows" in capsys.readouterr().err
    assert main(["bench", "--mdc-run", "somewhere"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["bench", "--sections", "caption,speed"]) == 2
    assert "unknown --sections ['speed']" in capsys.readouterr().err
    assert main(["bench", "--profile-row", "nope"]) == 2
    assert "unknown --profile-row" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_quick_json_in_fresh_processes(capsys):
    args = ["bench", "--quick", "--json", "--threads", "1", *sum((["--set", o] for o in MICRO_OVERRIDES), [])]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    for row in report["train"].values():
        assert "error" not in row and row["peak_mem_mib"] > 0


@pytest.mark.slow
def test_train_compile_gives_the_same_run(tmp_path):
    """train.compile=true compiles in place: the same losses (to fp tolerance) and the same checkpoint keys."""
    from safetensors.torch import load_file

    from mdc_core.train import train
    from mdc_workbench.data import write_synthetic_dataset
    from tests.train_helpers import assert_same_metrics, micro_run, read_metrics

    data = tmp_path / "data"
    write_synthetic_dataset(data, 16, image_size=32, n_val=4, n_test=4, n_compgen=4, shard_size=8, progress=False,
                            workers=1)
    runs = {}
    for flag in (False, True):
        out = tmp_path / f"compile_{flag}"
        train(micro_run(data, steps=2, batch_size=4, ckpt_every=2, compile=flag), out, progress=False)
        runs[flag] = out
    assert_same_metrics(read_metrics(runs[False]), read_metrics(runs[True]), rel=1e-4)
    keys = [set(load_file(str(next((r / "checkpoints").glob("step_*")) / "model.safetensors"))) for r in runs.values()]
    assert keys[0] == keys[1]


def test_coca_peer_head_is_initialised():
    """open_clip leaves CoCa's decoder projection as torch.empty memory; the peer must not depend on it."""
    import torch

    cfg = micro_config()
    garbage = [torch.full((cfg.text_width, 49408), float("nan")) for _ in range(8)]  # dirty the allocator
    del garbage
    torch.manual_seed(0)
    first = build_coca(cfg).text_decoder.text_projection.detach()
    torch.manual_seed(0)
    second = build_coca(cfg).text_decoder.text_projection.detach()
    assert torch.isfinite(first).all() and torch.equal(first, second)
    assert first.std() > 0.5 * cfg.text_width ** -0.5  # N(0, width^-1/2), not zeros


@pytest.mark.slow  # a compile of the micro model's whole step: minutes on two busy cores
def test_the_whole_step_row_trains_the_step_it_compiles(monkeypatch):
    """``mdc_whole`` (train.compile_step) times the same computation as ``mdc``: its FLOPs are the eager row's, its
    host operations are counted, its step time is a real number (aot_eager: the region traced as inductor would)."""
    import functools

    from mdc_core.loss_step import LossStep
    from mdc_workbench.bench import training
    from mdc_workbench.bench.core import bench_inputs

    monkeypatch.setattr(training, "LossStep", functools.partial(LossStep, backend="aot_eager"))
    cfg = load_preset("tiny", MICRO_OVERRIDES)
    payload = bench_inputs(cfg, cfg.train.batch_size, vocab_examples=64)
    rows = {name: training.measure_train_step(name, payload, steps=2, warmup=2, device="cpu", threads=1,
                                              count_ops=True) for name in ("mdc", "mdc_whole")}
    assert rows["mdc_whole"]["flops_per_step"] == rows["mdc"]["flops_per_step"] > 0
    assert math.isfinite(rows["mdc_whole"]["step_s"]) and rows["mdc_whole"]["compile_s"] > 0
    assert rows["mdc_whole"]["host_ops"]["aten_ops_per_step"] > 0

"""Captioning (Table 3): test-split loading from a Karpathy json / COCO json / the embedded data, decoders per
objective, one image encoding per batch shared by all decoders, a 2-step fine-tune, errors, table and CLI."""

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from mdc_core.checkpoint import latest_checkpoint
from mdc_core.config import RunConfig
from mdc_core.factory import load_model
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval import captioning as cap

from .test_eval_compositionality import make_run

WORDS = ["a red circle on the left", "a blue square at the top", "two green stars", "a small yellow triangle"]


@pytest.fixture
def karpathy(tmp_path):
    """dataset_coco.json with 4 train, 1 restval and 2 test images, two sentences each."""
    root = tmp_path / "coco"
    images = []
    for i, split in enumerate(["train"] * 4 + ["restval", "test", "test"]):
        (root / "val2014").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (40 * i, 20, 200 - 20 * i)).save(root / "val2014" / f"{i}.jpg")
        images.append({"filepath": "val2014", "filename": f"{i}.jpg", "split": split, "cocoid": i,
                       "sentences": [{"raw": WORDS[i % 4], "sentid": 2 * i},
                                     {"raw": WORDS[(i + 1) % 4], "sentid": 2 * i + 1}]})
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path


def test_karpathy_test_split_is_grouped_per_image(karpathy):
    items = cap.load_caption_set(karpathy, "test")
    assert [it.key for it in items] == ["5.jpg", "6.jpg"]
    assert items[0].references == (WORDS[1], WORDS[2])
    assert len(cap.load_caption_set(karpathy, "test", limit=1)) == 1
    assert cap._has_splits(str(karpathy))


def test_coco_json_export_has_no_splits(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                                "annotations": [{"image_id": 1, "caption": "x y", "id": 0},
                                                {"image_id": 1, "caption": "y z", "id": 1}]}))
    (item,) = cap.load_caption_set(path)
    assert item.references == ("x y", "y z")
    assert not cap._has_splits(str(path))


def test_embedded_data_references_are_the_short_and_long_captions(tmp_path):
    write_synthetic_dataset(tmp_path, 4, seed=0, image_size=32, n_val=1, n_test=3, n_compgen=1, progress=False,
                            workers=1)
    items = cap.load_caption_set(tmp_path, "test")
    assert len(items) == 3 and isinstance(items[0].image, bytes)
    assert len(items[0].references) == 2 and len(items[0].references[1]) > len(items[0].references[0])


def test_decoders_follow_the_paper():
    assert cap.decoders_for("mdc") == ["mdc-10", "mdc-15", "mdc-20"]
    assert cap.decoders_for("mdc", ["8", "median", "oracle", "auto"]) == ["mdc-8", "mdc-median", "mdc-oracle",
                                                                         "mdc-auto"]
    assert cap.decoder_label("mdc", "mdc-median", 8) == ("MDC", "8 (median)")
    assert cap.decoder_label("mdc", "mdc-oracle") == ("MDC", "per image (oracle)")
    assert cap.decoder_label("mdc", "mdc-arc") == ("MDC", "per image (ARC's)")
    with pytest.raises(ValueError, match="median, oracle, auto, arc"):
        cap.parse_lengths(["longest"])
    assert cap.decoders_for("arc") == ["greedy", "beam-6"]
    assert cap.decoders_for("arc", beam=1) == ["greedy"]
    assert cap.decoder_label("mdc", "mdc-15") == ("MDC", "15")
    assert cap.decoder_label("arc", "beam-6") == ("ARC (beam 6)", "-")
    with pytest.raises(ValueError, match="CLIP"):
        cap.decoders_for("clip")


def test_mdc_captions_have_the_asked_length_and_images_are_encoded_once(tmp_path, karpathy, monkeypatch):
    model, cfg = load_model(make_run(tmp_path))
    calls = []
    original = model.encode_image
    monkeypatch.setattr(model, "encode_image", lambda x: calls.append(len(x)) or original(x))
    items = cap.load_caption_set(karpathy, "test")
    out = cap.caption_items(model, cfg, items, ["mdc-4", "mdc-6"], batch_size=8, progress=False)
    assert calls == [2]  # one batch, encoded once for both decoders
    tok = CaptionTokenizer(cfg.model.context_length)
    with torch.no_grad():
        ids = cap.decode(model, original(torch.zeros(1, 3, 32, 32)), "mdc-6", max_length=22)
    assert ids.shape == (1, 6)
    assert set(out["mdc-4"]["captions"]) == {"5.jpg", "6.jpg"}
    assert out["mdc-4"]["captions"]["5.jpg"] == tok.decode(
        cap.decode(model, original(torch.stack([cap.image_pixels(items[0].image, 32)])), "mdc-4", max_length=22)[0])


def test_reference_lengths_prefer_the_images_own_caption():
    tok = CaptionTokenizer(12)
    items = [cap.CaptionItem("a", "a.jpg", ("a red circle", "a red circle on the left of a blue square"),
                             "a red circle"),
             cap.CaptionItem("b", "b.jpg", ("one", "one two three", "one two three four five")),
             cap.CaptionItem("c", "c.jpg", (" ".join(["word"] * 30),))]
    assert cap.reference_lengths(items, tok) == [3, 3, 10]  # own caption; median of three; cut at context - 2


def test_lengths_from_the_test_set_median_oracle_and_auto(tmp_path, karpathy):
    """oracle: each image at its own target length (images of one length sampled together); median: one N' for
    all; auto: MDC's own pick within the range."""
    model, cfg = load_model(make_run(tmp_path))
    with torch.no_grad():
        image_tokens = model.encode_image(torch.zeros(3, 3, 32, 32))
        oracle = cap.decode(model, image_tokens, "mdc-oracle", lengths=[3, 5, 3])
        median = cap.decode(model, image_tokens, "mdc-median", lengths=[4, 4, 4])
        auto = cap.decode(model, image_tokens, "mdc-auto", auto_range="2-4")
    assert oracle.shape == (3, 5) and (oracle[[0, 2], 3:] == cap.EOT_ID).all() and (oracle[1] != cap.EOT_ID).all()
    assert median.shape == (3, 4)
    assert all(2 <= int((row != cap.EOT_ID).sum()) <= 4 for row in auto)
    with pytest.raises(ValueError, match="one target length per image"):
        cap.decode(model, image_tokens, "mdc-oracle", lengths=[3])
    items = cap.load_caption_set(karpathy, "test")
    out = cap.caption_items(model, cfg, items, ["mdc-oracle"], lengths=[2, 5], progress=False)
    assert list(out["mdc-oracle"]["tokens"].values()) == [2, 5]


def test_arc_is_decoded_greedily_and_by_beam_search(tmp_path, karpathy):
    from mdc_core.ar_decode import beam_search, greedy
    model, cfg = load_model(make_run(tmp_path, "arc"))
    items = cap.load_caption_set(karpathy, "test")
    out = cap.caption_items(model, cfg, items, cap.decoders_for("arc", beam=2), max_length=5, progress=False)
    tok = CaptionTokenizer(cfg.model.context_length)
    with torch.no_grad():
        image_tokens = model.encode_image(torch.stack([cap.image_pixels(it.image, 32) for it in items]))
        want_greedy = [tok.decode(r) for r in greedy(model, image_tokens, max_tokens=5).tokens]
        want_beam = [tok.decode(r) for r in beam_search(model, image_tokens, beam_size=2, max_tokens=5).tokens]
    assert list(out["greedy"]["captions"].values()) == want_greedy
    assert list(out["beam-2"]["captions"].values()) == want_beam
    assert all(len(tok.encode_text(c)) <= 5 for c in want_greedy)


def test_table_is_percent_with_unavailable_metrics():
    rows = [{"label": "MDC", "run": "r", "length": "10",
             "metrics": {"BLEU@4": 0.207, "METEOR": 0.143, "CIDEr": 0.647, "SPICE": None, "ROUGE-L": 0.422}}]
    lines = cap.captioning_table(rows).splitlines()
    assert lines[0] == "| method | run | sequence length | B@4 | M | C | S | RL |"
    assert lines[2] == "| MDC | r | 10 | 20.7 | 14.3 | 64.7 | n/a | 42.2 |"


def test_two_step_finetune_starts_from_the_run_and_is_reused(tmp_path, karpathy):
    run = make_run(tmp_path)
    out = tmp_path / "ft"
    cap.finetune(run, karpathy, out, 2, overrides=["train.batch_size=2", "train.device=\"cpu\""], progress=False)
    ckpt = latest_checkpoint(out)
    assert json.loads((ckpt / "meta.json").read_text())["step"] == 2
    cfg = RunConfig.load(out / "config.json")
    assert cfg.data.path == str(karpathy) and cfg.train.steps == 2 and cfg.train.warmup_steps == 0
    before = load_file(str(latest_checkpoint(run) / "model.safetensors"))
    after = load_file(str(ckpt / "model.safetensors"))
    drift = max((before[k].float() - after[k].float()).abs().max().item() for k in before)
    assert 0 < drift < 0.01  # two Adam steps from the pretrained weights, not a re-initialised model
    lines = (out / "metrics.jsonl").read_text().splitlines()
    cap.finetune(run, karpathy, out, 2, overrides=["train.batch_size=2", "train.device=\"cpu\""],
                 progress=False)  # complete, of the same run, data and settings: reused, nothing trained
    assert (out / "metrics.jsonl").read_text().splitlines() == lines


def test_finetune_errors(tmp_path, karpathy):
    tok = CaptionTokenizer(24)
    vocab = torch.tensor(sorted(set(tok.encode_text("a red circle")) | {49407}))
    run = make_run(tmp_path, output_ids=vocab)
    with pytest.raises(ValueError, match="corpus vocabulary"):
        cap.finetune(run, karpathy, tmp_path / "ft", 2)
    assert not (tmp_path / "ft").exists()  # nothing written
    with pytest.raises(FileNotFoundError):
        cap.finetune(run, tmp_path / "missing.json", tmp_path / "ft", 2)
    with pytest.raises(ValueError, match="CLIP"):
        cap.captioning([make_run(tmp_path, "clip")], karpathy, out=tmp_path)
    with pytest.raises(ValueError, match="exceed the context"):
        cap.captioning([make_run(tmp_path, "mdc", name="m2")], karpathy, lengths=[30], out=tmp_path)


def test_cli_captioning_with_finetune(tmp_path, karpathy, capsys):
    from mdc_workbench.cli import main
    run = make_run(tmp_path)
    out = tmp_path / "eval"
    argv = ["eval", "captioning", "--run", str(run), "--data", str(karpathy), "--lengths", "4", "6",
            "--metrics", "BLEU", "ROUGE-L", "CIDEr", "--finetune-steps", "2", "--finetune-set", "train.batch_size=2",
            "--finetune-set", 'train.device="cpu"', "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| MDC | " in printed and "| 4 |" in printed and "| 6 |" in printed
    saved = json.loads((out / "captioning.json").read_text())
    assert saved["n_images"] == 2 and [r["length"] for r in saved["results"]] == ["4", "6"]
    assert all(0.0 <= r["metrics"]["CIDEr"] for r in saved["results"])
    assert saved["results"][0]["finetuned_run"].startswith(str(out / "finetune"))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"images": [{"id": 1, "file_name": "val2014/5.jpg"}],
                                 "annotations": [{"image_id": 1, "caption": "x", "id": 0}]}))
    assert main(["eval", "captioning", "--run", str(run), "--data", str(plain), "--finetune-steps", "2",
                 "--out", str(out)]) == 2
    assert "--finetune-data" in capsys.readouterr().err


def test_per_image_scores_average_to_the_corpus_scores_and_table3_keeps_lengths_apart(tmp_path, karpathy):
    """Each decoder's per-image CIDEr / ROUGE-L (Table 3's test items) list the images in caption order and
    average to the corpus scores; the table's rows name the length setting."""
    out = cap.captioning([make_run(tmp_path), make_run(tmp_path, "arc")], karpathy, lengths=[4, "median", "oracle"],
                         beam=2, metrics=["BLEU", "ROUGE-L", "CIDEr"], out=tmp_path, max_length=6, progress=False)
    # per image the median of its two references' token lengths: (6 + 3) / 2 -> 5 and (3 + 4) / 2 -> 4 (halves
    # round up); their median 4.5 -> 5
    assert out["median_length"] == 5
    for r in out["results"]:
        for metric in ("CIDEr", "ROUGE-L"):
            per = r["per_image"][metric]
            assert len(per) == len(r["captions"]) == 2
            assert sum(per) / len(per) == pytest.approx(r["metrics"][metric], abs=1e-9)
        assert sum(r["per_image"]["repetition"]) / 200 == pytest.approx(r["metrics"]["repetition_rate"])
    table = cap.table3(out)
    assert list(table["values"]) == ["MDC-4", "MDC (median length)", "MDC (oracle length)", "ARC (greedy)",
                                     "ARC"]
    assert set(table["values"]["ARC"]) == {"BLEU@4", "ROUGE-L", "CIDEr", "repetition", "length"}
    assert set(table["items"]["ARC"]) == {"ROUGE-L", "CIDEr", "repetition", "length"}  # BLEU: corpus-level only
    assert table["values"]["MDC-4"]["length"] == 4.0 and table["values"]["MDC (median length)"]["length"] == 5.0
    assert "N' = 5 for every image" in table["metric"]
    no_cider = cap.captioning([make_run(tmp_path, name="m3")], karpathy, lengths=[4], metrics=["BLEU"],
                              out=tmp_path, progress=False)
    assert set(no_cider["results"][0]["per_image"]) == {"repetition", "length"}


def _table3(rows: dict[str, dict[str, list[float]]]) -> dict:
    values = {row: {col: sum(v) / len(v) for col, v in cols.items()} for row, cols in rows.items()}
    return {"tables": {"table3": {"metric": "x", "values": values, "items": rows}}}


def test_table3_is_descriptive_and_its_matched_row_matches_lengths():
    """The paper calls MDC-N vs ARC 'not directly comparable' and claims no order: every Table 3 row is an
    observation (differences with intervals, no verdict); the matched row is MDC at ARC's length per image."""
    from mdc_workbench.eval.claims import claims_markdown, evaluate_claims, gather_tables
    good, bad = [300.0] * 9 + [0.0] * 3, [300.0] * 3 + [0.0] * 9  # CIDEr per image on 12 images
    rows = {"MDC-10": {"CIDEr": bad}, "MDC (ARC's length)": {"CIDEr": good, "length": [9.0] * 6 + [7.0] * 6},
            "MDC (median length)": {"CIDEr": good}, "MDC (oracle length)": {"CIDEr": good},
            "ARC": {"CIDEr": bad, "length": [9.0] * 6 + [7.0] * 6}}
    results = {r["key"]: r for r in evaluate_claims(gather_tables([("nb", 0, _table3(rows))]))}
    matched = results["table3_matched"]
    assert matched["kind"] == "observation" and matched["verdict"] is None
    assert all(p["verdict"] is None for p in matched["parts"])
    cider = next(p for p in matched["parts"] if p["column"] == "CIDEr")
    assert cider["difference"]["mean"] == pytest.approx(150) and cider["lengths"] == [8.0, 8.0]
    assert "; lengths 8.0 vs 8.0 tokens" in "\n".join(claims_markdown([matched]))  # says at which length
    unmatched = results["table3_lengths"]
    assert unmatched["verdict"] is None and all(p["verdict"] is None for p in unmatched["parts"])
    assert {p["better"] for p in unmatched["parts"]} == {"MDC-10", "MDC (median length)", "MDC (oracle length)"}
    assert "row MDC (auto length)" in unmatched["missing"]
    assert not any(r["table"] == "table3" and r["verdict"] is not None for r in results.values())


def test_mdc_at_arcs_length_writes_as_many_tokens_as_arc_per_image(tmp_path, karpathy):
    out = cap.captioning([make_run(tmp_path), make_run(tmp_path, "arc")], karpathy, lengths=["arc"], beam=2,
                         metrics=["BLEU"], out=tmp_path, max_length=6, progress=False)
    rows = {cap.table3_row(r): r for r in out["results"]}
    assert list(rows) == ["MDC (ARC's length)", "ARC (greedy)", "ARC"]  # the order of the runs given
    arc = rows["ARC"]["per_image"]["length"]
    assert rows["MDC (ARC's length)"]["per_image"]["length"] == [max(1.0, n) for n in arc]
    with pytest.raises(ValueError, match="needs an ARC run"):
        cap.captioning([make_run(tmp_path, name="m4")], karpathy, lengths=["arc"], out=tmp_path, progress=False)

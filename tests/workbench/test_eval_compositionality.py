"""Compositionality (Table 2): the benchmark loaders on real-format fixtures, the pick-the-true-caption rule,
one image encoding per example, CLIP cosine scores, unscorable captions, the table, errors and the CLI."""

import json
import random

import pytest
import torch
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import ObjectiveConfig, RunConfig
from mdc_core.factory import CLIPModel
from mdc_core.model import Captioner
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval import compositionality as comp
from mdc_workbench.eval.composition_sets import (
    Example,
    example_pixels,
    load_benchmark,
    pre_caption,
    shuffle_trigrams,
    shuffle_within_trigrams,
)
from tests.conftest import micro_config


def _image(path, size=(48, 40), colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def make_run(tmp_path, objective="mdc", name=None, output_ids=None):
    """A micro run folder (one checkpoint, no training) for `objective`."""
    torch.manual_seed(0)
    cfg = RunConfig(model=micro_config(), objective=ObjectiveConfig(name=objective))
    if output_ids is not None:
        cfg.model.output_vocab, cfg.model.output_vocab_size = "corpus", len(output_ids)
    if objective == "clip":
        model = CLIPModel(cfg.model, vocab_ids=output_ids)
    else:
        model = Captioner(cfg.model, causal=objective == "arc", output_ids=output_ids)
    run = tmp_path / (name or objective)
    save_checkpoint(run, 0, cfg, model)
    return run


@pytest.fixture
def aro_dir(tmp_path):
    root = tmp_path / "aro"
    _image(root / "images" / "1.jpg", (60, 50))
    _image(root / "images" / "2.jpg", (30, 30), (10, 200, 10))
    items = [
        {"image_id": "1", "image_path": "1.jpg", "bbox_x": 10, "bbox_y": 5, "bbox_w": 30, "bbox_h": 20,
         "true_caption": "the horse is eating the grass", "false_caption": "the grass is eating the horse",
         "relation_name": "eating"},
        {"image_id": "2", "image_path": "2.jpg", "bbox_x": 0, "bbox_y": 0, "bbox_w": 30, "bbox_h": 30,
         "true_caption": "the cat is on the mat", "false_caption": "the mat is on the cat", "relation_name": "on"},
    ]
    (root / "visual_genome_relation.json").write_text(json.dumps(items))
    attrs = [dict(items[0], true_caption="the white horse and the green grass",
                  false_caption="the green horse and the white grass", attributes=["white", "green"])]
    (root / "visual_genome_attribution.json").write_text(json.dumps(attrs))
    return root


@pytest.fixture
def sugarcrepe_dir(tmp_path):
    root = tmp_path / "sugarcrepe"
    _image(root / "images" / "000000000001.jpg")
    _image(root / "images" / "000000000002.jpg", colour=(0, 0, 255))
    (root / "add_obj.json").write_text(json.dumps({
        "0": {"filename": "000000000001.jpg", "caption": "a dog on a sofa",
              "negative_caption": "a dog and a cat on a sofa"},
        "1": {"filename": "000000000002.jpg", "caption": "a man with a hat",
              "negative_caption": "a man with a hat and a dog"}}))
    (root / "swap_att.json").write_text(json.dumps({
        "0": {"filename": "000000000001.jpg", "caption": "a white dog on a red sofa",
              "negative_caption": "a red dog on a white sofa"}}))
    return root


def test_aro_vg_loader_reads_the_published_format_and_crops_to_the_box(aro_dir):
    ex = load_benchmark("aro-relation", aro_dir)
    assert [e.positive for e in ex] == ["the horse is eating the grass", "the cat is on the mat"]
    assert ex[0].negatives == {"relation": ("the grass is eating the horse",)}
    assert ex[0].crop == (10.0, 5.0, 30.0, 20.0)
    assert example_pixels(ex[0], 32).shape == (3, 32, 32)
    attr = load_benchmark("aro-attribution", aro_dir / "visual_genome_attribution.json")
    assert attr[0].negatives == {"attribute": ("the green horse and the white grass",)}
    assert len(load_benchmark("aro-relation", aro_dir, limit=1)) == 1


def test_sugarcrepe_loader_reads_every_task_file_present(sugarcrepe_dir):
    ex = load_benchmark("sugarcrepe", sugarcrepe_dir)
    assert sorted({t for e in ex for t in e.negatives}) == ["add_obj", "swap_att"]
    assert len(ex) == 3 and ex[0].image.endswith("images/000000000001.jpg")
    assert len(load_benchmark("sugarcrepe", sugarcrepe_dir, limit=1)) == 2  # the limit is per task


def test_order_perturbations_follow_aro():
    assert pre_caption("A Dog, (running)! On the beach.") == "a dog, running on the beach"
    assert pre_caption("one two three four", max_words=2) == "one two"
    text = "a man riding a wave on top of surfboards"  # 9 words: three whole trigrams
    for _ in range(5):
        rng = random.Random(_)
        within, across = shuffle_within_trigrams(text, rng), shuffle_trigrams(text, rng)
        words = text.split()
        grams = [words[i:i + 3] for i in range(0, len(words), 3)]
        assert [sorted(g) for g in (within.split()[i:i + 3] for i in range(0, len(words), 3))] == \
            [sorted(g) for g in grams]  # each trigram keeps its words, in some order
        assert sorted(" ".join(g) for g in grams) == sorted(
            " ".join(across.split()[i:i + 3]) for i in range(0, len(words), 3))  # trigrams kept whole


def test_coco_order_from_aro_json_and_from_precomputed_cases(tmp_path):
    _image(tmp_path / "val2014" / "a.jpg")
    (tmp_path / "coco_karpathy_test.json").write_text(json.dumps([
        {"image": "val2014/a.jpg", "caption": ["A man riding a wave on top of a surfboard.", "A surfer."],
         "image_id": 1}]))
    ex = load_benchmark("coco-order", tmp_path)
    assert len(ex) == 2 and ex[0].positive == "a man riding a wave on top of a surfboard"
    negs = ex[0].negatives["coco_order"]
    assert len(negs) >= 2 and all(sorted(n.split()) == sorted(ex[0].positive.split()) for n in negs)
    assert load_benchmark("coco-order", tmp_path, seed=0)[0] == ex[0]  # seeded: reproducible
    pre = tmp_path / "pre.json"
    pre.write_text(json.dumps([{"image": "val2014/a.jpg", "caption_options": ["a b c", "c b a", "b a c"]}]))
    (only,) = load_benchmark("flickr-order", pre)
    assert only.positive == "a b c" and only.negatives == {"flickr_order": ("c b a", "b a c")}


def test_candidates_dedupe_and_drop_negatives_equal_to_the_truth():
    ex = Example("k", "x.jpg", "a b", {"order": ("a b", "b a"), "add": ("b a", "a b c")})
    texts, tasks = ex.candidates()
    assert texts == ["a b", "b a", "a b c"]
    assert tasks == {"order": [1], "add": [1, 2]}


def _fake_scorer(calls):
    def score(model, image, captions, tokens, **kw):
        calls.append(captions)
        return [-float(len(c)) for c in captions], None  # shorter caption = higher score
    return score


def test_accuracy_is_strictly_true_beats_every_negative_and_image_encoded_once(tmp_path, aro_dir, sugarcrepe_dir,
                                                                              monkeypatch):
    calls = []
    monkeypatch.setitem(comp.SCORERS, "heuristic", _fake_scorer(calls))
    run = make_run(tmp_path)
    from mdc_core.factory import load_model
    model, cfg = load_model(run)
    encoded = []
    original = model.encode_image
    monkeypatch.setattr(model, "encode_image", lambda x: encoded.append(x.shape) or original(x))
    ex = load_benchmark("sugarcrepe", sugarcrepe_dir)
    (res,) = comp.evaluate_model(model, cfg, ex, ["heuristic"], progress=False)
    # add_obj: both negatives are longer -> correct; swap_att: same length -> a tie -> wrong
    assert res["tasks"]["add_obj"] == {"correct": 2, "n": 2, "accuracy": 1.0}
    assert res["tasks"]["swap_att"]["accuracy"] == 0.0
    assert res["columns"] == {"add": 1.0, "swap": 0.0}
    assert res["label"] == "MDC (Heuristic)" and res["n_examples"] == 3
    assert len(encoded) == 3 and all(s[0] == 1 for s in encoded)  # one encoding per example
    assert [len(c) for c in calls] == [2, 2, 2]  # true + false caption in one call per example


@pytest.mark.parametrize("objective,methods", [("mdc", ["heuristic", "mc", "ar"]), ("arc", ["ar"])])
def test_real_scorers_decide_as_score_captions_does(tmp_path, aro_dir, objective, methods):
    from mdc_core.factory import load_model
    from mdc_workbench.cli.scores import score_captions
    ex = load_benchmark("aro-relation", aro_dir)
    tok = CaptionTokenizer(24)
    vocab = torch.tensor(sorted({i for e in ex for c in e.candidates()[0] for i in tok.encode_text(c)} | {49407}))
    model, cfg = load_model(make_run(tmp_path, objective, output_ids=vocab))  # a small head: fast on CPU
    results = comp.evaluate_model(model, cfg, ex, methods, samples=16, progress=False)
    for res, method in zip(results, methods, strict=True):
        assert res["method"] == method and res["n_examples"] == 2
        for e, rec in zip(ex, res["examples"], strict=True):
            with torch.no_grad():
                image_tokens = model.encode_image(example_pixels(e, 32)[None])
                want = [r["score"] for r in score_captions(model, image_tokens, rec["captions"], method, samples=16)]
            assert rec["scores"] == pytest.approx(want, rel=1e-5, abs=1e-5)
            assert rec["correct"]["relation"] == (want[0] > want[1])
            assert ("stderr" in rec) == (method == "mc")


def test_sugarcrepe_columns_average_the_sub_tasks():
    tasks = {"replace_obj": {"accuracy": 1.0}, "replace_att": {"accuracy": 0.5}, "replace_rel": {"accuracy": 0.0},
             "relation": {"accuracy": 0.25}}
    assert comp.column_accuracies(tasks) == {"relation": 0.25, "replace": 0.5}


def test_clip_cosine_equals_the_model_similarity(tmp_path, aro_dir):
    torch.manual_seed(0)
    model = CLIPModel(micro_config()).eval()
    tok = CaptionTokenizer(24)
    captions = ["the horse is eating the grass", "the grass is eating the horse"]
    image = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        got, stderr = comp.SCORERS["cosine"](model, image, captions, tok(captions))
        want = model.similarity(image, tok(captions))[0]
    torch.testing.assert_close(torch.tensor(got), want)


def test_unscorable_examples_are_skipped_and_counted(tmp_path, aro_dir, monkeypatch):
    monkeypatch.setitem(comp.SCORERS, "heuristic", _fake_scorer([]))
    tok = CaptionTokenizer(24)
    vocab = torch.tensor(sorted(set(tok.encode_text("the cat is on mat")) | {49407}))
    run = make_run(tmp_path, output_ids=vocab)
    from mdc_core.factory import load_model
    model, cfg = load_model(run)
    ex = load_benchmark("aro-relation", aro_dir)
    ex.append(Example("long", ex[1].image, "the cat " * 20, {"relation": ("the mat",)}))
    ex.append(Example("add", ex[1].image, "the cat is on the mat",
                      {"relation": ("the mat is on the cat",), "add": ("the horse is on the mat",)}))
    (res,) = comp.evaluate_model(model, cfg, ex, ["heuristic"], progress=False)
    assert res["n_examples"] == 2  # the true captions of the others use other words or overflow the context
    assert res["skipped"] == {"out_of_vocabulary": 1, "too_long": 1, "add/out_of_vocabulary": 1}
    assert res["tasks"]["relation"]["n"] == 2 and "add" not in res["tasks"]
    assert res["examples"][1]["captions"] == ["the cat is on the mat", "the mat is on the cat"]


def test_methods_must_fit_the_objective():
    assert comp.check_methods("mdc", None) == ("mc", "heuristic")
    assert comp.check_methods("arc", []) == ("ar",)
    assert comp.check_methods("clip", None) == ("cosine",)
    assert comp.check_methods("bert", ["ar", "heuristic"]) == ("ar", "heuristic")
    for objective, method in (("clip", "ar"), ("arc", "heuristic"), ("mdc", "cosine"), ("mdc", "nope")):
        with pytest.raises(ValueError, match=method):
            comp.check_methods(objective, [method])


def test_table_merges_benchmarks_per_run_and_method():
    results = [
        {"run": "r1", "method": "heuristic", "label": "MDC (Heuristic)", "columns": {"relation": 0.846}},
        {"run": "r1", "method": "heuristic", "label": "MDC (Heuristic)", "columns": {"add": 0.978, "swap": 0.785}},
        {"run": "r2", "method": "cosine", "label": "CLIP", "columns": {"add": 0.665}},
    ]
    table = comp.compositionality_table(results).splitlines()
    assert table[0] == "| method | run | ARO relation | SugarCrepe add | SugarCrepe swap |"
    assert table[2] == "| MDC (Heuristic) | r1 | 84.6 | 97.8 | 78.5 |"
    assert table[3] == "| CLIP | r2 | - | 66.5 | - |"


def test_missing_data_and_unknown_benchmark_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_benchmark("aro-relation", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="visual_genome_relation.json"):
        load_benchmark("aro-relation", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="SugarCrepe"):
        load_benchmark("sugarcrepe", tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("winoground", tmp_path)


def test_missing_image_names_the_file(tmp_path, aro_dir, monkeypatch):
    monkeypatch.setitem(comp.SCORERS, "heuristic", _fake_scorer([]))
    ex = load_benchmark("aro-relation", aro_dir, images=tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        example_pixels(ex[0], 32)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write_synthetic_dataset(out, 8, seed=0, image_size=32, n_val=2, n_test=6, n_compgen=2, progress=False, workers=1)
    return out


def test_synth_negatives_map_to_table2_columns(synth_dir):
    ex = load_benchmark("synth", synth_dir, limit=4)
    assert len(ex) == 4 and isinstance(ex[0].image, bytes)
    tasks = {t for e in ex for t in e.negatives}
    assert tasks <= {"relation", "attribute", "order", "add", "replace"} and tasks
    assert example_pixels(ex[0], 32).shape == (3, 32, 32)


def test_cli_runs_every_family_on_the_embedded_data(tmp_path, synth_dir, capsys):
    from mdc_workbench.cli import main
    runs = [make_run(tmp_path, o) for o in ("mdc", "arc", "clip")]
    out = tmp_path / "eval"
    argv = ["eval", "compositionality", "--data", str(synth_dir), "--limit", "3", "--samples", "8",
            "--out", str(out), "--quiet"]
    for r in runs:
        argv += ["--run", str(r)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| MDC (Monte Carlo) |" in printed and "| ARC |" in printed and "| CLIP |" in printed
    saved = json.loads((out / "compositionality_synth.json").read_text())
    assert [r["label"] for r in saved["results"]] == ["MDC (Monte Carlo)", "MDC (Heuristic)", "ARC", "CLIP"]
    assert (out / "compositionality_synth.md").read_text().startswith("| method |")
    # ar on a CLIP run, and a missing data set: one-line errors
    assert main(["eval", "compositionality", "--run", str(runs[2]), "--data", str(synth_dir), "--methods", "ar",
                 "--out", str(out)]) == 2
    assert "mdc: error:" in capsys.readouterr().err
    assert main(["eval", "compositionality", "--run", str(runs[0]), "--data", str(tmp_path / "nope"),
                 "--benchmark", "sugarcrepe", "--out", str(out)]) == 2
    assert "not found" in capsys.readouterr().err

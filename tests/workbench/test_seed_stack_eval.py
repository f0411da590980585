"""A seed stack's evaluation (issue 63, item 3): the central-claim measure and captioning of K members at once.

Mode "each" gives every member its solo measure's numbers to the bit (its solo captions to the token); mode "vmap"
(one vmapped forward over the stacked weights) the solo numbers within tolerances scaled to the values. The members
are three seeds' initialisations of the micro captioner (no training: the measures do not care how the weights came
about, and the three differ).
"""

import math
import warnings

import pytest
import torch

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig
from mdc_core.data import iter_captions
from mdc_core.factory import create_model
from mdc_core.tokenizer import build_output_vocab
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval.captioning import captioning, table3
from mdc_workbench.eval.central_claim import caption_batches, central_claim_runs, claim_table, connector_ids
from mdc_workbench.eval.items import member_run_id, read_items, write_run_items
from mdc_workbench.eval.recompute import item_runs
from mdc_workbench.seed_stack.captioning import captioning_members
from mdc_workbench.seed_stack.claim import central_claim_members, stacked_claim_scores
from mdc_workbench.seed_stack.items import write_member_items
from mdc_workbench.seed_stack.train import member_dir
from tests.conftest import micro_config
from tests.numerics import assert_close_to_scale
from tests.train_helpers import one_thread  # noqa: F401 - a fixture

SEEDS = [3, 5, 8]  # the members' training seeds (here: their initialisations)
KINDS = ("short", "clauses")
SETTINGS = dict(limit=8, batch_size=4, draws=2, pool=3)  # the measure at toy size


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """({kind: data folder}, {objective: [member run folders]}): ARC and MDC members of seeds SEEDS."""
    root = tmp_path_factory.mktemp("stack_eval")
    data = {}
    for kind in KINDS:
        data[kind] = root / kind
        write_synthetic_dataset(data[kind], 8, image_size=32, n_val=2, n_test=8, n_compgen=2, progress=False,
                                workers=1, captions=kind, difficulty="easy")
    ids = build_output_vocab([c for kind in KINDS for c in iter_captions(DataConfig(path=str(data[kind])),
                                                                          split="test")])
    runs = {}
    for objective in ("arc", "mdc"):
        for seed in SEEDS:
            torch.manual_seed(seed)
            cfg = RunConfig(model=micro_config(context_length=32, output_vocab="corpus", output_vocab_size=len(ids)),
                            objective=ObjectiveConfig(name=objective))
            save_checkpoint(root / f"{objective}_{seed}", 1, cfg, create_model(cfg, objective, ids))
            runs.setdefault(objective, []).append(str(root / f"{objective}_{seed}"))
    return data, runs


def flat(scores, measure):
    return [v for row in getattr(scores, measure) for v in row]


def assert_same_scores(got, want, exact):
    assert (got.mode, got.groups, got.tokens) == (want.mode, want.groups, want.tokens)
    for measure in ("gradient", "pmi"):
        a, b = flat(got, measure), flat(want, measure)
        assert [v is None for v in a] == [v is None for v in b], measure  # the same positions scored
        a = torch.tensor([v for v in a if v is not None], dtype=torch.float64)
        b = torch.tensor([v for v in b if v is not None], dtype=torch.float64)
        assert len(b) > 0
        if exact:
            assert torch.equal(a, b), measure
        else:
            assert_close_to_scale(a, b, rel=1e-4, msg=measure)


# ----------------------------------------------------------------------------------------------------------
# the central claim


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_each_members_central_claim_is_its_solo_measure(stack, mode):
    data, runs = stack
    pairs = {kind: [runs["arc"], runs["mdc"]] for kind in KINDS}
    seeds = [11, 12, 13]  # each member its own mask draws, seeded as its solo measure's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        members = central_claim_members(pairs, data, seed=seeds, mode=mode, **SETTINGS)
    assert not [w for w in caught if "batching rule" in str(w.message)]  # vmap loops over no member
    assert len(members) == len(SEEDS)
    for k in range(len(SEEDS)):
        solo = central_claim_runs({kind: [runs["arc"][k], runs["mdc"][k]] for kind in KINDS}, data, seed=seeds[k],
                                  **SETTINGS)
        assert members[k].keys() == solo.keys() and all(members[k][t].keys() == solo[t].keys() for t in solo)
        for kind in KINDS:
            for row in ("ARC", "MDC"):
                assert_same_scores(members[k][kind][row], solo[kind][row], exact=mode == "each")
        if mode == "each":
            assert claim_table(members[k], connector_ids()) == claim_table(solo, connector_ids())
    # the members' own weights, not one member's K times
    assert flat(members[0]["short"]["ARC"], "pmi") != flat(members[1]["short"]["ARC"], "pmi")


def test_one_seed_for_all_members_still_draws_each_members_own_masks(stack):
    """One seed given: every member draws from its own generator seeded with it (as K solo measures with that seed),
    not the members one after another from one stream: members 1 and 2 would then score other positions."""
    data, runs = stack
    from mdc_core.factory import load_model

    models = [load_model(r)[0].eval() for r in runs["mdc"]]
    batches = list(caption_batches(data["short"], 32, 32, limit=8, batch_size=4))
    objective = ObjectiveConfig(name="mdc")
    got = stacked_claim_scores(models, batches, objective=objective, draws=2, pool=3, seeds=4, mode="vmap")
    from mdc_workbench.eval.central_claim import score_captions

    for k, model in enumerate(models):
        want = score_captions(model, batches, objective=objective, draws=2, pool=3, seed=4)
        assert_same_scores(got[k], want, exact=False)


def test_member_items_files_are_the_solo_runs_files(stack, tmp_path):
    data, runs = stack
    pairs = {kind: [runs["arc"], runs["mdc"]] for kind in KINDS}
    members = central_claim_members(pairs, data, seed=0, mode="each", **SETTINGS)
    paths = write_member_items(tmp_path / "stack__seeds=3-5-8", SEEDS, scored=members)
    for k, seed in enumerate(SEEDS):
        solo = central_claim_runs({kind: [runs["arc"][k], runs["mdc"][k]] for kind in KINDS}, data, seed=0,
                                  **SETTINGS)
        want = read_items(write_run_items(tmp_path / f"solo_{seed}", seed, scored=solo))
        assert paths[k] == member_dir(tmp_path / "stack__seeds=3-5-8", seed) / "items.npz"
        got = read_items(paths[k])
        assert got.run_id == member_run_id("stack__seeds=3-5-8", seed) == f"stack__seeds=3-5-8/seed={seed}"
        assert (got.seed, got.tables, got.probe) == (want.seed, want.tables, want.probe)
        for name in got.signal:  # NaN (not scored) compares equal to NaN
            assert [("nan" if isinstance(v, float) and math.isnan(v) else v) for v in got.signal[name]] == \
                [("nan" if isinstance(v, float) and math.isnan(v) else v) for v in want.signal[name]], name
    gathered = item_runs(tmp_path / "stack__seeds=3-5-8")  # what mdc recompute reads: one run per member seed
    assert [(r[0], r[1]) for r in gathered] == [(member_run_id("stack__seeds=3-5-8", s), s) for s in SEEDS]
    with pytest.raises(ValueError, match="2 results for 3 members"):
        write_member_items(tmp_path / "bad", SEEDS, scored=members[:2])


# ----------------------------------------------------------------------------------------------------------
# captioning


def without_timing(result):
    return {**result, "results": [{k: v for k, v in r.items() if k != "seconds"} for r in result["results"]]}


def test_each_members_captions_are_its_solo_runs(stack):
    data, runs = stack
    settings = dict(lengths=[4, "arc"], beam=2, limit=6, metrics=["ROUGE-L", "CIDEr"], batch_size=4, max_length=6)
    members = captioning_members([runs["mdc"], runs["arc"]], data["short"], mode="each", **settings)
    assert len(members) == len(SEEDS)
    for k in range(len(SEEDS)):
        solo = captioning([runs["mdc"][k], runs["arc"][k]], data["short"], progress=False, **settings)
        assert without_timing(members[k]) == without_timing(solo)  # captions, metrics and per-image items
        assert table3(members[k]) == table3(solo)
    captions = [[c["caption"] for c in m["results"][0]["captions"]] for m in members]
    assert captions[0] != captions[1]  # the members' own weights


def test_vmapped_captioning_encodes_each_member_as_its_solo_run(stack):
    """vmap carries the encoder only (the decoding runs per member, as in each): its image tokens are each member's
    own within rounding, and the captions follow (equal here; a near tie could flip an argmax on another CPU, so
    the test holds what does not depend on one: the images, decoders, lengths and references)."""
    data, runs = stack
    from mdc_core.factory import load_model
    from mdc_workbench.eval.captioning import chunk_pixels, load_caption_set
    from mdc_workbench.seed_stack.stacked import Encode, stack_models, vmap_members

    models = [load_model(r)[0].eval() for r in runs["mdc"]]
    pixels = chunk_pixels(load_caption_set(data["short"], "test", 4), 32)
    stacked = stack_models(models)
    with torch.no_grad():
        got = vmap_members(Encode(stacked), stacked, pixels, in_dims=(None,))  # (K, B, M, D)
        for k, model in enumerate(models):
            assert_close_to_scale(got[k], model.encode_image(pixels), rel=1e-5)
    settings = dict(lengths=[4], limit=6, metrics=["CIDEr"], batch_size=4)
    members = captioning_members([runs["mdc"]], data["short"], mode="vmap", **settings)
    for k in range(len(SEEDS)):
        solo = captioning([runs["mdc"][k]], data["short"], progress=False, **settings)
        for a, b in zip(members[k]["results"], solo["results"], strict=True):
            assert (a["decoder"], a["per_image"]["length"]) == (b["decoder"], b["per_image"]["length"])
            assert [(c["key"], c["references"]) for c in a["captions"]] == \
                [(c["key"], c["references"]) for c in b["captions"]]


def test_the_eval_bench_times_every_row_against_the_solo_measures():
    from mdc_workbench.seed_stack.bench_eval import ROWS, claim_rows, format_rows
    from tests.conftest import MICRO_SETS

    rows = claim_rows([1, 2], preset="tiny", limit=4, batch=2, draws=1, pool=1, overrides=MICRO_SETS[1::2])
    assert [(r["row"], r["members"]) for r in rows] == [(row, k) for k in (1, 2) for row in ROWS]
    assert all(r["seconds"] > 0 and r["member_cpu_s"] > 0 for r in rows)
    assert all(r["member_s"] == pytest.approx(r["seconds"] / r["members"]) for r in rows)
    assert [r["vs_solo"] for r in rows if r["row"] == "solo"] == [1.0, 1.0]
    assert format_rows(rows).count("\n") == len(rows) + 1


# ----------------------------------------------------------------------------------------------------------
# bad input


def test_a_stack_refuses_bad_input_in_one_line(stack, tmp_path):
    data, runs = stack
    from mdc_core.factory import load_model

    models = [load_model(r)[0].eval() for r in runs["mdc"]]
    batches = list(caption_batches(data["short"], 32, 32, limit=4, batch_size=4))
    other = RunConfig(model=micro_config(context_length=32, text_width=48), objective=ObjectiveConfig(name="mdc"))
    save_checkpoint(tmp_path / "wide", 1, other, create_model(other, "mdc"))
    unknown = int((models[0].output_index < 0).nonzero()[-1])  # an id the members' corpus head has no row for
    images, tokens, groups = batches[0]
    strange = [(images, tokens.clone().index_put_((torch.tensor([0]), torch.tensor([2])), torch.tensor(unknown)),
                groups)]
    errors = []
    for call, match in [
        (lambda: stacked_claim_scores(models, strange, objective=ObjectiveConfig(name="mdc"), mode="vmap"),
         "vocabulary"),
        (lambda: stacked_claim_scores(models, strange, objective=ObjectiveConfig(name="mdc"), mode="each"),
         "vocabulary"),
        (lambda: stacked_claim_scores([models[0], load_model(tmp_path / "wide")[0]], batches, mode="each"),
         "share one architecture"),
        (lambda: stacked_claim_scores(models, batches, mode="fast"), "mode 'fast'"),
        (lambda: stacked_claim_scores(models, [], mode="vmap"), "no caption to score"),
        (lambda: stacked_claim_scores([], batches), "at least one member"),
        (lambda: stacked_claim_scores(models, batches, seeds=[1, 2]), "2 seeds for 3 members"),
        (lambda: stacked_claim_scores([load_model(runs["arc"][0])[0], models[0]], batches), "all left-to-right"),
        (lambda: central_claim_members({"short": [runs["arc"][:2], runs["mdc"]]}, data), "same number of members"),
        (lambda: central_claim_members({"short": [[runs["arc"][0], runs["mdc"][1]]]}, data), "mixes objectives"),
        (lambda: captioning_members([runs["mdc"]], data["short"], mode="fast"), "mode 'fast'"),
        (lambda: captioning_members([], data["short"]), "give stacks"),
        (lambda: captioning_members([[runs["mdc"][0], tmp_path / "wide"]], data["short"], lengths=[4],
                                    metrics=["CIDEr"]), "share one architecture"),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            call()
        errors.append(str(err.value))
    assert all("\n" not in e for e in errors)

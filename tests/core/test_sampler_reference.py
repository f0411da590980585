"""The sampler gives exactly the outputs of its former implementation (tests/sampler_reference.py) for every option:
greedy k = 1 and k > 1, Fast-dLLM's threshold, temperature with and without top-k, revisable tokens, prompts (with
and without an explicit fixed mask), attention capture, a corpus-restricted head; every field of SampleOutput."""

import dataclasses

import pytest
import torch

from mdc_core.config import SamplerConfig
from mdc_core.sampler import sample
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer, build_output_vocab
from tests.sampler_reference import sample as reference_sample

CASES = {
    "greedy": (SamplerConfig(length=7), {}),
    "k3": (SamplerConfig(length=7, tokens_per_step=3), {}),
    "threshold": (SamplerConfig(length=7, tokens_per_step=2, threshold=3.2e-5), {}),  # some extra reveals (full head)
    "threshold_corpus": (SamplerConfig(length=7, threshold=0.0915), {}),  # some extra reveals (corpus head)
    "temperature": (SamplerConfig(length=7, temperature=1.3, seed=5), {}),
    "temperature_top_k": (SamplerConfig(length=7, tokens_per_step=2, temperature=0.8, top_k=20, seed=1), {}),
    "remask": (SamplerConfig(length=7, remask_threshold=0.9, remask_steps=5), {}),
    "remask_k2_threshold": (SamplerConfig(length=7, tokens_per_step=2, threshold=3.2e-5, remask_threshold=0.95,
                                          remask_steps=3), {}),
    "remask_temperature": (SamplerConfig(length=7, temperature=1.0, seed=2, remask_threshold=0.9, remask_steps=4), {}),
    "attention": (SamplerConfig(length=7, tokens_per_step=2), {"attention": True}),
    "prompt": (SamplerConfig(length=7), {"prompt": "rows"}),
    "prompt_fixed_remask": (SamplerConfig(length=7, remask_threshold=0.9, remask_steps=3), {"prompt": "fixed"}),
}


def _kwargs(extra: dict, batch: int) -> dict:
    kw = {k: v for k, v in extra.items() if k != "prompt"}
    if extra.get("prompt") == "rows":
        prompt = torch.full((batch, 7), MASK_ID)
        prompt[0, 1], prompt[1, 2:4], prompt[2, 0] = 320, torch.tensor([1746, 2108]), 320
        kw["prompt"] = prompt
    elif extra.get("prompt") == "fixed":
        kw["prompt"] = torch.tensor([320, 1746, 2108, 320, 1746, 2108, 320])
        kw["fixed"] = torch.tensor([True, False, False, False, True, False, False])
    return kw


def _assert_same(new, old) -> None:
    for f in dataclasses.fields(old):
        a, b = getattr(new, f.name), getattr(old, f.name)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, f.name
            assert torch.equal(a, b), f.name
        else:
            assert a == b, f.name
            assert not isinstance(b, dict) or list(a) == list(b), f"{f.name}: key order"  # the JSON record's order


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("corpus", [False, True])
def test_sample_equals_the_former_implementation(tiny_model, name, corpus):
    cfg, extra = CASES[name]
    ids = None
    if corpus:
        ids = build_output_vocab(["a red circle on the left", "two blue squares", "a big green star"],
                                 CaptionTokenizer(24))
        ids = torch.unique(torch.cat([ids, torch.tensor([320, 1746, 2108])]))  # the prompt's words
    model = tiny_model(seed=4, output_ids=ids)
    torch.manual_seed(0)
    image_tokens = model.encode_image(torch.randn(3, 3, 32, 32))
    kw = _kwargs(extra, 3)
    _assert_same(sample(model, image_tokens, cfg, **kw), reference_sample(model, image_tokens, cfg, **kw))

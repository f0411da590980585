"""A sampler option is declared once, on SamplerConfig (mdc_core.config.option): a dummy field added to a subclass
appears as an ``mdc sample`` flag with its help, in that flag's range check, in the run's config and among the app's
controls and API parameters, with nothing else changed."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import gradio as gr
import pytest
from mdc_app import callbacks as A
from mdc_app import layout as L

from mdc_core import config
from mdc_core.config import ConfigError, RunConfig, SamplerConfig, apply_overrides, option
from mdc_workbench.cli import build_parser
from mdc_workbench.cli.checks import check_numeric_args
from mdc_workbench.cli.sample import sampler_overrides


@dataclass
class WithDummy(SamplerConfig):
    dummy: float = option(0.25, "a dummy option of this test", label="dummy knob", range=(0.0, 0.5))


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "SamplerConfig", WithDummy)


def sample_args(*extra: str):
    return build_parser().parse_args(["sample", "--run", "run", "--image", "img.png", *extra])


def test_the_declaration_is_read_where_it_is_used():
    """Without the dummy, none of this knows it (the fixture is what adds it)."""
    assert "dummy" not in vars(sample_args()) and "dummy" not in A.SAMPLER_FIELDS


def test_a_new_option_is_a_flag_with_its_help_and_its_range_check(dummy, capsys):
    args = sample_args("--dummy", "0.4")
    assert args.dummy == 0.4 and "sampler.dummy=0.4" in sampler_overrides(args)
    check_numeric_args(args)  # in range
    with pytest.raises(ValueError, match=r"^--dummy must be in \[0, 0.5\], got 0.9$"):
        check_numeric_args(sample_args("--dummy", "0.9"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sample", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--dummy DUMMY a dummy option of this test (0-0.5; default: the run's)" in shown
    cfg = apply_overrides(RunConfig(), sampler_overrides(args))  # the run's config takes it, and checks it
    assert cfg.sampler.dummy == 0.4 and isinstance(cfg.sampler, WithDummy)
    with pytest.raises(ConfigError, match=r"sampler.dummy must be in \[0, 0.5\], got 0.9"):
        apply_overrides(RunConfig(), ["sampler.dummy=0.9"])


def test_a_new_option_is_an_app_control_and_an_api_parameter(dummy):
    names = [o.name for o in A.sampler_inputs()]
    assert names[-2:] == ["dummy", "seed"]  # the sliders, then the number boxes
    controls = {c.label: c for c in L._sampler_inputs(WithDummy(), 22)}
    knob = controls["dummy knob"]
    assert isinstance(knob, gr.Slider) and (knob.minimum, knob.maximum, knob.value, knob.step) == (0.0, 0.5, 0.25, 0.05)
    values = [getattr(WithDummy(dummy=0.4), name) for name in names]
    assert A.sampler_config(*values).dummy == 0.4
    with pytest.raises(gr.Error, match=r"sampler.dummy must be in \[0, 0.5\]"):
        A.sampler_config(*[0.9 if name == "dummy" else v for name, v in zip(names, values, strict=True)])

    def endpoint(run: str, sampler: SamplerConfig, prompt: str = "") -> tuple[str, float, str]:
        return run, sampler.dummy, prompt

    wrapped = A.takes_sampler_settings(endpoint)
    assert list(inspect.signature(wrapped).parameters) == ["run", *names, "prompt"]
    assert wrapped("micro", *values, prompt="a _") == ("micro", 0.4, "a _")

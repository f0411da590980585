"""The app's API as a script sees it: the shipped model served on a free loopback port (analytics and telemetry
off), called through ``gradio_client`` with named parameters; docs/app.md's example is run as written."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported (app/__init__.py sets them too)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from mdc_core.config import SamplerConfig  # noqa: E402
from mdc_core.workbench.shipped import SHIPPED_DIR, SHIPPED_LABEL  # noqa: E402
from tests.train_helpers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS_URL = "http://127.0.0.1:7860/"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on the shipped model, on 127.0.0.1 and a free port; a client of it."""
    from gradio_client import Client
    from mdc_app.launch import serve
    port = free_port()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        demo = serve(SHIPPED_DIR, root=None, port=port, block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        yield {"url": url, "client": Client(url, verbose=False, download_files=False), "console": out.getvalue(),
               "tmp": tmp_path_factory.mktemp("api")}
    finally:
        demo.close()


def _docs_example() -> str:
    """The first python block after docs/app.md's "Calling the app from a script" heading."""
    text = (ROOT / "docs" / "app.md").read_text()
    section = text.split("## Calling the app from a script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _check_trajectory(result: dict, length: int) -> None:
    """A greedy (k = 1) trajectory: one reveal per step, each position once, canvases that fill up to the caption."""
    steps = result["steps"]
    assert len(steps) == length == len(result["tokens"])
    assert result["caption"] == steps[-1]["text"] and steps[-1]["canvas"] == result["tokens"]
    positions = [r["position"] for s in steps for r in s["revealed"]]
    assert sorted(positions) == list(range(length))
    for i, step in enumerate(steps):
        assert step["step"] == i and len(step["revealed"]) == 1 and step["remasked"] == []
        assert all(0.0 <= r["confidence"] <= 1.0 for r in step["revealed"])
        assert step["canvas"].count("[MASK]") == length - i - 1
        for r in step["revealed"]:
            assert step["canvas"][r["position"]] == result["tokens"][r["position"]] == r["token"]


def test_docs_example_runs_against_the_live_app(served):
    code = _docs_example()
    assert DOCS_URL in code and 'api_name="/caption_json"' in code
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace(DOCS_URL, served["url"]), "docs/app.md", "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    assert result["run"] == SHIPPED_LABEL and result["source"] == "scene 3"
    assert result["settings"]["length"] == 10 and result["settings"]["temperature"] == 0.0
    _check_trajectory(result, 10)
    lines = [line for line in printed.getvalue().splitlines() if not line.startswith("Loaded as API")]  # the client's
    print("\n".join(lines))  # what docs/app.md shows
    assert lines[0] == result["caption"] and len(lines) == 1 + 10
    assert lines[-1].endswith("-> " + result["caption"])


def test_named_parameters_an_uploaded_image_and_the_pages_endpoints(served):
    from gradio_client import handle_file
    client = served["client"]
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    fields = list(SamplerConfig.__dataclass_fields__)
    params = [p["parameter_name"] for p in api["/caption_json"]["parameters"]]
    assert params == ["run", "length", "tokens_per_step", "temperature", "top_k", "threshold", "remask_threshold",
                      "remask_steps", "seed", "image", "scene", "prompt"]
    assert set(params[1:9]) <= set(fields)
    assert not [p for e in api.values() for p in e["parameters"] if p["parameter_name"].startswith("param_")]
    assert not [r for e in api.values() for r in e["returns"] if r["label"].startswith("value_")]

    scene = client.predict(scene=3, length=8, api_name="/caption_json")
    image_path = served["tmp"] / "scene3.png"
    from mdc_app.callbacks import show_scene
    show_scene(3, SHIPPED_LABEL, None)[0]["image"].save(image_path)
    uploaded = client.predict(image=handle_file(str(image_path)), length=8, api_name="/caption_json")
    assert uploaded["source"] == "image" and uploaded["caption"] == scene["caption"]  # the same pixels
    _check_trajectory(uploaded, 8)
    fixed = client.predict(scene=3, prompt="a drawing of a _ square", api_name="/caption_json")
    assert fixed["fixed"] == [0, 1, 2, 3, 5] and fixed["steps"][0]["canvas"][:4] == ["a", "drawing", "of", "a"]
    with pytest.raises(Exception, match="give an image or a scene number"):
        client.predict(length=8, api_name="/caption_json")
    with pytest.raises(Exception, match="greater than maximum value 2.0"):  # gradio checks the slider range
        client.predict(scene=3, temperature=5.0, api_name="/caption_json")

    client.predict(scene=3, run=SHIPPED_LABEL, api_name="/show_scene")  # the page's endpoints, in this session
    chips, step, _, summary = client.predict(run=SHIPPED_LABEL, length=8, api_name="/caption")
    assert 'data-step="8"' in chips and step["maximum"] == 8 and scene["caption"] in summary


def test_console_points_to_the_clis_share_flag(served):
    console = served["console"]
    assert f"* Running on local URL:  {served['url']}" in console and f"{served['url']}?view=api" in console
    assert "`mdc app --share`" in console and "share=True" not in console
